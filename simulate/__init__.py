"""Graph arrays -> predicted schedule: Daydream's Algorithm 1, compiled with numba.

``simulate(SimGraph) -> Schedule``; see ``simulate.graph`` for the input contract.
"""

from simulate.check import SimulationDeadlock
from simulate.engine import Schedule, simulate
from simulate.graph import END, FCFS, FIXED, PRIORITY, START, START_START, SimGraph

__all__ = ["END", "FCFS", "FIXED", "PRIORITY", "START", "START_START", "Schedule", "SimGraph",
           "SimulationDeadlock", "simulate"]
