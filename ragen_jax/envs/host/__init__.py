"""Stepping host text environments, one instance per episode, concurrently and fault-isolated.

pool: `HostPool`, the handle (thread mode here, process mode in workers); records: what it
returns per episode (`Start`, `Outcome`, `Plan`, `EnvFault`), its modes and its logger; actor:
one episode's instance on its own thread and the checks of what it returns; core: the logic both
modes share; workers: the worker processes of mode="process".
"""
