import os
import sys

# Spawned ranks import test modules by name: make the project root importable.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
# Several ranks share 2 cores: one intra-op thread each avoids oversubscription.
os.environ.setdefault("OMP_NUM_THREADS", "1")
