"""Graph arrays -> predicted schedule: Daydream's Algorithm 1, compiled with numba (ahead of time
where a C compiler is: daydream.base.compiled).

``simulate(SimGraph) -> Schedule``; see ``simulate.graph`` for the input contract.
"""

from daydream.simulate.codes import END, FCFS, FIXED, PRIORITY, START, START_START
from daydream.simulate.engine import Schedule, SimulationDeadlock, simulate
from daydream.simulate.graph import SimGraph

__all__ = ["END", "FCFS", "FIXED", "PRIORITY", "START", "START_START", "Schedule", "SimGraph",
           "SimulationDeadlock", "simulate"]
