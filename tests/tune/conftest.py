import sys
from pathlib import Path

# the fake OpenAI/admin server lives with the bench tests
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
