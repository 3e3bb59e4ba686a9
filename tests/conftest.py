import sys
from pathlib import Path

# Test helpers (exactness.py, ggufs.py) are imported as plain modules.
sys.path.insert(0, str(Path(__file__).parent))
