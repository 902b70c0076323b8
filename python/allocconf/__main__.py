"""python -m allocconf: print allocconf's status."""
from allocconf import status

print(status())
