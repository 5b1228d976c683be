"""`jaxdist.experimental`: the names TF keeps under `tf.distribute.experimental`, and
jaxdist's own knobs (the in-flight bound, compile counts, host malloc tuning).

>>> import jaxdist as jd
>>> jd.experimental.CommunicationOptions(
...     implementation=jd.experimental.CommunicationImplementation.NCCL).implementation.name
'NCCL'
>>> jd.experimental.get_max_steps_in_flight() >= 1
True
"""

from jaxdist._base.cpu_threads import cpu_threads as cpu_threads
from jaxdist._base.inflight import get_max_steps_in_flight as get_max_steps_in_flight
from jaxdist._base.inflight import set_max_steps_in_flight as set_max_steps_in_flight
from jaxdist._base.options import CommunicationImplementation as CommunicationImplementation
from jaxdist._base.options import CommunicationOptions as CommunicationOptions
from jaxdist._cluster.host import tune_host_malloc as tune_host_malloc
from jaxdist._program.compile import step_count as step_count
from jaxdist._program.explain import explain as explain
from jaxdist._state.recheck import StateCheckError as StateCheckError
from jaxdist._state.recheck import set_state_checks as set_state_checks
from jaxdist._state.recheck import state_checks as state_checks
from jaxdist._strategy.multi_worker import (
    MultiWorkerMirroredStrategy as MultiWorkerMirroredStrategy,
)
from jaxdist._values.trees import ValueContext as ValueContext

__all__ = [
    "CommunicationImplementation",
    "CommunicationOptions",
    "MultiWorkerMirroredStrategy",
    "StateCheckError",
    "ValueContext",
    "cpu_threads",
    "explain",
    "get_max_steps_in_flight",
    "set_max_steps_in_flight",
    "set_state_checks",
    "state_checks",
    "step_count",
    "tune_host_malloc",
]
