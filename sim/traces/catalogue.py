"""The four registered trace presets (importing this module registers them).

Each builder's docstring is its preset's summary (``gyre trace presets``):
what the workload is, which targets are the paper's (docs/workload.md#workload-profile and
5.1) and which are ours, the assumptions and their reasons, and what the fit
found. Fitted parameters come from ``gyre trace fit --preset NAME`` (100,000
queries x 16, seed 20240601); the trajectory split (``calls_per_branch``,
``branch_weight``) from ``traces.trajectories.fit_trajectory_model`` (10,000
queries x 16, seed 20240601) to the J_max shares of docs/workload.md#training-cost-and-slack: 41.4 % of the
trained tokens kept at J_max = 1, 74.8 % at 5 (paper for nl2repo-122b; ours,
the same shares, for the other presets); everything else is set by hand. ``gyre trace stats``
prints every preset's targets beside the achieved values and the fit error.
"""

from __future__ import annotations

from gyre.sim.traces.model import DurationModel
from gyre.sim.traces.presets import TracePreset, _preset

SPEC5 = "paper: docs/workload.md#workload-profile, 122B profile"
AS_REALIZED = ("ours: the trace value at which the default E0 run realizes the 122B figure of "
               "docs/workload.md#workload-profile (1.93 h, 2.96 h, 9.51 %; mean over seeds 0-7), "
               "docs/simulator.md section 3; summary.json reports the realized value")
SPEC51 = "paper: docs/workload.md#hard-queries, at most 9.51% of queries hold a timed-out execution"
MILLION = "paper: docs/workload.md#workload-profile, 'about a million tokens' per execution (order of magnitude)"
JMAX = {"jmax1_token_share": 0.414, "jmax5_token_share": 0.748}  # trajectories.SPEC51_KEPT_SHARE
JMAX_PAPER = {k: "paper: docs/workload.md#training-cost-and-slack, forward-backward time vs uncapped (122B)"
              for k in JMAX}
JMAX_OURS = {k: "ours: the 122B shares of docs/workload.md#training-cost-and-slack, reused (none for this workload)"
             for k in JMAX}


@_preset
def nl2repo_122b() -> TracePreset:
    """NL2Repo with Qwen 3.6 122B (docs/workload.md#workload-profile): build a repository from a spec.

    Paper targets (docs/workload.md): mean execution 1.93 h, mean query (slowest
    of 16) 2.96 h, 9.51 % of queries above 4 h, harness timeouts 6.25 % and
    overall timeouts 0.87 % of executions, as realized in the default run
    (E0 on the 122B cluster, with its engine load, 30 s sandbox start and
    wall-clock deadlines): the slowest executions of a burst end on
    emptying engines, so queries realize shorter than they are traced, and
    the trace's own figures are 1.961 h, 3.027 h and 10.36 %. The six shape
    parameters were fitted (``gyre trace fit``) to the paper's figures times
    the stated/realized ratio; the fit cannot meet the three at once, so
    ``difficulty_log_mean`` and ``execution_log_sd`` were then set by hand
    so that E0 realizes 1.944 h, 2.940 h and 9.54 % (mean over seeds 0-7).
    Timeout rates realize exactly (deadlines are on the wall clock, and the
    rare classes are quotas). Bounds: at most 9.51 % of queries hold a
    timeout, and so at most 9.51 % sit at the ceiling or the budget.
    Ours: a timed-out query holds 13 timeouts out of 16 on average (docs/workload.md#hard-queries
    says only "most"; 13 puts 8.6 % of queries at the ceiling, under the
    bound, and leaves ~0.9 pp of queries that pass 4 h on a long completion);
    0.5 % outright failures; ~1M tokens (the paper's order), 5 % output;
    18 s per model call with its tool time (~390 calls per execution).
    Assumptions: harness ceiling 5 h. docs/workload.md#hard-queries needs it above 4 h (else no
    query could exceed 4 h); the profile does not pin it. 5 h is the first
    whole hour above 4 h: with all timed-out queries at >= 5 h, the others
    must average (2.96 - 0.088 * ~5.3) / 0.91 = 2.74 h for their slowest
    execution, and a higher ceiling would only lower that further. Total
    budget 5.5 h: 30 min of evaluation retries after the ceiling, so an
    overall timeout lasts 5.5 h; only executions stopped at the ceiling can
    run out of budget (the others have hours left for retries).
    Fitted: hard queries are the hardest 8.6 % by difficulty and an
    execution of one gets stuck with probability 0.83, so 8.6 % of queries
    hold a timeout (independent timeouts at the same rate: 69 %); 12.3 % of
    the executions stopped at the ceiling then time out overall. Median
    duration exp(0.506) = 1.66 h, sigma_e = 0.291 within a group. Finding:
    the profile leaves no between-query duration spread outside the hard
    queries (the fit drives sigma_q to ~0): the 1.93 h / 2.96 h ratio needs
    sigma_e ~ 0.28, which alone spreads the slowest of 16 by ~0.16 in log,
    and the other 91 % of queries must average 2.74 h for their slowest
    with under 1 % of them past 4 h. Difficulty acts through the hard class.
    """
    return TracePreset(
        name="nl2repo-122b",
        model=DurationModel(
            # with execution_log_sd: set so E0 realizes docs/workload.md#workload-profile (docstring)
            difficulty_log_mean=0.5060,
            difficulty_log_sd=0.0,  # the fit drives it to 0: see the docstring
            execution_log_sd=0.2910,
            hard_share=0.0863,
            stuck_rate=0.8255,
            overall_share=0.1226,
            ceiling_h=5.0,
            budget_h=5.5,
            failed_rate=0.005,
            call_s=18.0,
            tokens_per_call=2564.7522,
            output_share=0.05,
            calls_per_branch=55.70,  # ~8 trajectories per execution, the main one ~41 % of the tokens
            branch_weight=0.2096,
        ),
        targets={
            "mean_execution_h": 1.961,  # AS_REALIZED: E0 realizes 1.93
            "mean_query_h": 3.027,  # E0 realizes 2.96
            "queries_over_4h": 0.1036,  # E0 realizes 0.0951
            "harness_timeout_rate": 0.0625,
            "overall_timeout_rate": 0.0087,
            "timeouts_per_timed_out_query": 13.0,
            "failed_rate": 0.005,
            "mean_tokens": 1.0e6,
            **JMAX,
        },
        bounds={"queries_with_timeout": 0.0951, "queries_at_ceiling": 0.0951},
        sources={
            **JMAX_PAPER,
            "mean_execution_h": AS_REALIZED,
            "mean_query_h": AS_REALIZED,
            "queries_over_4h": AS_REALIZED,
            "harness_timeout_rate": SPEC5,
            "overall_timeout_rate": SPEC5,
            "timeouts_per_timed_out_query": "ours: docs/workload.md#hard-queries says 'most' time out together",
            "failed_rate": "ours: the paper gives no rate of outright failures",
            "mean_tokens": MILLION,
            "queries_with_timeout": SPEC51,
            "queries_at_ceiling": SPEC51 + " (a query at the ceiling holds one)",
        },
    )


@_preset
def nl2repo_2_4t() -> TracePreset:
    """NL2Repo with Qwen 3.8 2.4T (docs/workload.md#workload-profile): the same task, a slower model.

    Paper targets (docs/workload.md#workload-profile): 61.1 % of queries above 4 h; 38.2 % of queries
    whose longest execution ends in an overall timeout; "timeout ceiling
    relaxed" and "durations cluster near the ceiling" (qualitative).
    Ours, i.e. assumptions (the source gives no more): the relaxed harness
    ceiling is 6 h (one hour above the 122B preset's 5 h), the total budget
    6.5 h (30 min of evaluation retries); 10 % harness and 5 % overall
    timeouts (kept from the earlier preset); 25 % of executions last at
    least 80 % of the ceiling (4.8 h), our number for "cluster near the
    ceiling" (7 % for 122B); mean execution 3.8 h, the value the other
    targets leave (3.0 h, the earlier guess, cannot meet them with timeouts
    concentrated per query); 0.5 % failures; 30 s per model call; ~1M
    tokens per execution, 5 % output, with a per-execution spread of tokens
    per call of 0.25 in log (0.3 elsewhere): these executions average over
    ~450 calls each, and with durations clustered near the ceiling a 0.3
    spread would make tokens follow calls more loosely (correlation 0.78)
    than on every other preset (> 0.8).
    Fitted: median duration exp(1.25) = 3.5 h, sigma_q = 0.34 between
    queries and sigma_e = 0.13 within a group (a group ends together); the
    hardest 54 % of queries get stuck with probability 0.17 per execution
    and a third of the stopped executions run out of budget, so 52 % of
    queries hold a timeout and p90 of executions is the ceiling.
    """
    return TracePreset(
        name="nl2repo-2.4t",
        model=DurationModel(
            difficulty_log_mean=1.2467,
            difficulty_log_sd=0.3429,
            execution_log_sd=0.1321,
            hard_share=0.5416,
            stuck_rate=0.1745,
            overall_share=0.3346,
            ceiling_h=6.0,
            budget_h=6.5,
            failed_rate=0.005,
            call_s=30.0,
            tokens_per_call=2206.4554,
            output_share=0.05,
            token_log_sd=0.25,
            calls_per_branch=60.81,
            branch_weight=0.2035,
        ),
        targets={
            "queries_over_4h": 0.611,
            "slowest_overall_timeout_share": 0.382,
            "mean_execution_h": 3.8,
            "harness_timeout_rate": 0.10,
            "overall_timeout_rate": 0.05,
            "near_ceiling_share": 0.25,
            "failed_rate": 0.005,
            "mean_tokens": 1.0e6,
            **JMAX,
        },
        sources={
            **JMAX_OURS,
            "queries_over_4h": "paper: docs/workload.md#workload-profile, 2.4T profile",
            "slowest_overall_timeout_share": "paper: docs/workload.md#workload-profile, 2.4T profile",
            "mean_execution_h": "ours: the paper gives no mean for 2.4T",
            "harness_timeout_rate": "ours: the paper gives no rate for 2.4T",
            "overall_timeout_rate": "ours: the paper gives no rate for 2.4T",
            "near_ceiling_share": "ours: docs/workload.md#workload-profile says durations cluster near the ceiling",
            "failed_rate": "ours: the paper gives no rate of outright failures",
            "mean_tokens": MILLION,
        },
    )


def _short_task_sources(kind: str) -> dict[str, str]:
    keys = ("mean_execution_h", "mean_query_h", "harness_timeout_rate", "overall_timeout_rate",
            "slowest_overall_timeout_share", "queries_with_timeout", "failed_rate", "mean_tokens")
    return {k: f"ours: docs/workload.md#workload-profile gives only the {kind} cluster, not its durations"
            for k in keys}


@_preset
def deepswe() -> TracePreset:
    """DeepSWE-like software-engineering tasks (fix an issue in a repository).

    docs/workload.md#workload-profile gives only the cluster (24 nodes, 6 cells, B = 48, N = 16)
    and the heavy, clustered tail; every target here is ours (an assumption):
    mean execution 0.40 h, mean query (slowest of 16) 0.85 h, harness ceiling
    1.5 h with 3 % harness timeouts, total budget 2 h with 0.5 % overall
    timeouts that cluster (5 % of queries have one as their slowest), 14 %
    of queries hold a timeout (about 4 each: less concentrated than NL2Repo,
    more of these short tasks end on a plain long run), 1 % failures; 12 s per
    model call (~120 calls); ~300k tokens per execution, 5 % output.
    Fitted: median duration exp(-1.22) = 0.30 h, sigma_q = 0.57 between
    queries, sigma_e = 0.53 within a group; the hardest 4.0 % of queries get
    stuck with probability 0.57 per execution; 14 % of stopped executions
    then time out overall; 4.0 timeouts per timed-out query (44 % of
    queries would hold one if timeouts were independent).
    """
    return TracePreset(
        name="deepswe",
        model=DurationModel(
            difficulty_log_mean=-1.2194,
            difficulty_log_sd=0.5699,
            execution_log_sd=0.5296,
            hard_share=0.0403,
            stuck_rate=0.5727,
            overall_share=0.1439,
            ceiling_h=1.5,
            budget_h=2.0,
            failed_rate=0.01,
            call_s=12.0,
            tokens_per_call=2513.9564,
            output_share=0.05,
            calls_per_branch=23.81,
            branch_weight=0.2523,
        ),
        targets={
            "mean_execution_h": 0.40,
            "mean_query_h": 0.85,
            "harness_timeout_rate": 0.03,
            "overall_timeout_rate": 0.005,
            "slowest_overall_timeout_share": 0.05,
            "queries_with_timeout": 0.14,
            "failed_rate": 0.01,
            "mean_tokens": 3.0e5,
            **JMAX,
        },
        sources={**_short_task_sources("DeepSWE"), **JMAX_OURS},
    )


@_preset
def terminalbench() -> TracePreset:
    """TerminalBench-like terminal tasks (drive a shell to reach a goal state).

    docs/workload.md#workload-profile gives only the cluster (24 nodes, 6 cells, B = 48, N = 16)
    and the heavy, clustered tail; every target here is ours (an assumption):
    mean execution 0.25 h, mean query (slowest of 16) 0.55 h, harness ceiling
    1 h with 4 % harness timeouts, total budget 1.25 h with 0.5 % overall
    timeouts that cluster (5 % of queries have one as their slowest), 18 %
    of queries hold a timeout (about 4 each), 1.5 % failures (container
    set-up); 8 s per model call (~110 calls); ~150k tokens per execution, 8 %
    output.
    Fitted: median duration exp(-1.80) = 0.17 h, sigma_q = 0.71 between
    queries, sigma_e = 0.61 within a group; the hardest 3.0 % of queries get
    stuck with probability ~1 per execution; 11 % of stopped executions
    then time out overall (52 % of queries would hold a timeout if timeouts
    were independent). The fit leaves the mean query ~2 % above its target:
    it trades it against the small shares.
    """
    return TracePreset(
        name="terminalbench",
        model=DurationModel(
            difficulty_log_mean=-1.7984,
            difficulty_log_sd=0.7146,
            execution_log_sd=0.6118,
            hard_share=0.0303,
            stuck_rate=0.9977,
            overall_share=0.1115,
            ceiling_h=1.0,
            budget_h=1.25,
            failed_rate=0.015,
            call_s=8.0,
            tokens_per_call=1344.2865,
            output_share=0.08,
            calls_per_branch=26.23,
            branch_weight=0.2726,
        ),
        targets={
            "mean_execution_h": 0.25,
            "mean_query_h": 0.55,
            "harness_timeout_rate": 0.04,
            "overall_timeout_rate": 0.005,
            "slowest_overall_timeout_share": 0.05,
            "queries_with_timeout": 0.18,
            "failed_rate": 0.015,
            "mean_tokens": 1.5e5,
            **JMAX,
        },
        sources={**_short_task_sources("TerminalBench"), **JMAX_OURS},
    )
