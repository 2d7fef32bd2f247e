import sys
from pathlib import Path

# the export helpers of tests/sweeps (test_export_layouts.exported, test_run_rows.make_run)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
