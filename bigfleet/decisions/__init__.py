"""The decision log: what each cycle did or would have done, and why, kept to answer "why" later.

    cycle -> Plan + engine.holds --entries.decisions_of--> rows
          --DecisionLog.defer, then .build off the cycle (bounded buffer, repeats suppressed)-->
          --DecisionLog.run (batches, off the cycle)--> PostgreSQL decision_log
    bigfleet why machine M / why need C/N --> bigfleet.store.decisions.DecisionStore

Vocabulary: a *decision* is one row — an action (provision, assign,
preempt, reclaim, release, verify), a *hold* (a drain a budget or
do-not-disrupt kept back) or an *unmet* need with its why-not; its *mode*
says whether it was carried out (active) or only recorded (shadow,
dry-run, paused).
"""

from bigfleet.decisions.entries import Decision, Mode, decisions_of
from bigfleet.decisions.log import DecisionLog, DecisionSink, LogLimits

__all__ = ["Decision", "DecisionLog", "DecisionSink", "LogLimits", "Mode", "decisions_of"]
