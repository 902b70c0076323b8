import os
import sys

# Make tests/support.py and tests/recorder.py importable from every suite.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
