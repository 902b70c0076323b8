import os
import sys

# Make the helpers package (tests/helpers/) importable from every suite.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
