"""Action plugin of library/job_watch.py: runs the module on the host, then prints its progress line on the
controller, so a long pull or weight fetch shows one line of progress per interval at any verbosity.

The role task retries job_watch until the job ends (`until: ... .done`); without this plugin the play would show
only Ansible's "FAILED - RETRYING" countdown between intervals, since a module cannot print while it runs and the
retry line carries the result only at -vvv."""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(self._execute_module(module_name="job_watch", task_vars=task_vars))
        message = result.get("message")
        # The last report (done) is shown by the role's own task; each one before it is printed here.
        if message and not result.get("done") and not result.get("failed"):
            display.display(f"  [{task_vars.get('inventory_hostname', '?')}] {message}")
        return result
