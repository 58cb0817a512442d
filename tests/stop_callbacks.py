"""A Hydra callback for the driver's tests (on the driver's path through PYTHONPATH): it sends the driver a signal
from inside Hydra's own code, at a chosen moment of a chosen point, as a user's Ctrl-C or a closed terminal may."""
import os
import signal

from hydra.experimental.callback import Callback


class SignalAt(Callback):
    """`signal_name` (e.g. SIGHUP) to this process at `moment` (job_start or job_end) of the point numbered `job`."""

    def __init__(self, signal_name: str, moment: str, job: int = 0):
        self.signum = signal.Signals[signal_name]
        self.moment = moment
        self.job = job

    def _send(self, moment: str, config) -> None:
        if moment == self.moment and config.hydra.job.num == self.job:
            os.kill(os.getpid(), self.signum)

    def on_job_start(self, config, **kwargs) -> None:
        self._send("job_start", config)

    def on_job_end(self, config, job_return, **kwargs) -> None:
        self._send("job_end", config)
