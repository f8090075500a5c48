"""gptrmctl depends on common/ and the Admin API only: importing it loads none of the coordinator's components."""

from __future__ import annotations

import subprocess
import sys


class TestCtlImports:
    def test_no_component_package_is_imported(self) -> None:
        """Loading gptrmctl's entry point imports nothing from the scheduler, sync, monitor or adaptor packages."""
        code = ("import sys, coordinator.ctl.main; "
                "print('\\n'.join(m for m in sys.modules if m.startswith('coordinator.')))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        loaded = out.split()
        assert "coordinator.ctl.main" in loaded
        assert [m for m in loaded if m.split(".")[1] in ("scheduler", "sync", "monitor", "adaptor", "qos")] == []
