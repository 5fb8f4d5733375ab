"""``cuvil failsafe``: degraded-mode policies synthesized from a spec and proved (``synth``), a policy
file proved again against its spec (``check``), the region where a decision network is trusted
(``region``), and a policy run through random fault sequences (``simulate``). Exit 0 every scenario
has a proved mode / every entry proves / every cell is decided / no violation; 1 a scenario is
unrealizable, an entry is refuted or a step violates an invariant; 3 something is undecided; 2 usage
or input error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cuvil.cli.common import (
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNDECIDED,
    add_report_arguments,
    check_output,
    check_report_outputs,
    write_reports,
)
from cuvil.errors import FileAccessError


def _settings(**values: Any) -> dict[str, Any]:
    return {**values, "command_line": " ".join(["cuvil", *sys.argv[1:]]) if sys.argv else "cuvil failsafe"}


def _read_policy(path: str) -> Any:
    from failsafe.policy import Policy

    p = Path(path)
    if not p.is_file():
        raise FileAccessError(f"policy file {p} does not exist", location=str(p))
    return Policy.from_json(p.read_bytes(), source=str(p), check_digest=False)


def _network(spec: Any, model: str | None) -> Any:
    """The spec's decision network (``--model`` overrides its path), or None when the spec names none."""
    from dataclasses import replace

    from cuvil.errors import InputError
    from failsafe.network import load_decision_model

    if spec.model is None:
        if model:
            raise InputError(f"{spec.source or 'the spec'} names no decision model for --model to replace",
                             location="--model", hint="add `model: {path: ..., inputs: [...], outputs: [...]}` "
                                                      "to the spec")
        return None
    return load_decision_model(replace(spec.model, path=str(Path(model).resolve())) if model else spec.model, spec)


def cmd_synth(args: argparse.Namespace) -> int:
    from cuvil import __version__
    from failsafe.load import load_spec
    from failsafe.report import to_report
    from failsafe.synth import synthesize
    from reports import render_terminal

    check_report_outputs(args)
    check_output(args.output, "--output", suffix=".json")
    spec = load_spec(Path(args.spec))

    def progress(message: str) -> None:
        sys.stderr.write(f"{message}\n")

    model = _network(spec, args.model) if args.model else None
    policy = synthesize(spec, model=model, time_limit=args.time_limit, progress=None if args.quiet else progress)
    if args.output:
        Path(args.output).write_text(policy.to_json())
    report = to_report(policy, version=__version__, settings=_settings(spec=args.spec, time_limit=args.time_limit))
    write_reports(report, args)
    if not args.quiet:
        render_terminal(report)
    if policy.unrealizable:
        return EXIT_FAILED
    return EXIT_OK if all(e.verdict == "proved" for e in policy.table) else EXIT_UNDECIDED


def cmd_check(args: argparse.Namespace) -> int:
    from cuvil import __version__
    from failsafe.load import load_spec
    from failsafe.policy import check_policy
    from failsafe.report import check_report
    from reports import render_terminal

    check_report_outputs(args)
    spec = load_spec(Path(args.spec))
    policy = _read_policy(args.policy)
    verdicts = check_policy(spec, policy, network=_network(spec, args.model) if args.model else None)
    report = check_report(policy, verdicts, version=__version__)
    write_reports(report, args)
    if not args.quiet:
        render_terminal(report)
    statuses = {v.status for v in verdicts}
    if statuses & {"refuted", "error"}:
        return EXIT_FAILED
    return EXIT_UNDECIDED if "unknown" in statuses else EXIT_OK


def cmd_simulate(args: argparse.Namespace) -> int:
    import json

    from failsafe.load import load_spec
    from failsafe.simulate import simulate

    spec = load_spec(Path(args.spec))
    policy = _read_policy(args.policy)
    sim = simulate(spec, policy, steps=args.steps, seed=args.seed, network=_network(spec, args.model))
    summary = {"steps": sim.steps, "violations": sim.violations, "uncovered": sim.uncovered,
               "unsampled": sim.unsampled, "fault_changes": sim.fault_changes, "per_scenario": sim.per_scenario,
               "per_invariant": sim.per_invariant, "first_violation": sim.first_violation}
    if spec.model is not None:
        summary |= {"network_steps": sim.network_steps, "fallback_steps": sim.fallback_steps}
    if args.json:
        check_output(args.json, "--json")
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    if not args.quiet:
        sys.stderr.write(f"{sim.steps} steps, {sim.fault_changes} fault changes: {sim.violations} violations, "
                         f"{sim.uncovered} in scenarios without a mode, {sim.unsampled} unsampled\n")
        if spec.model is not None:
            sys.stderr.write(f"the network acted in {sim.network_steps} steps inside its trusted region, the "
                             f"fallback in {sim.fallback_steps}\n")
        if sim.first_violation:
            sys.stderr.write(f"first violation: {sim.first_violation}\n")
    if sim.violations:
        return EXIT_FAILED
    return EXIT_UNDECIDED if sim.uncovered or sim.unsampled else EXIT_OK


def cmd_region(args: argparse.Namespace) -> int:
    """The region of the state box where the spec's decision network provably keeps the invariants."""
    import json
    from dataclasses import replace

    from cuvil.errors import InputError
    from failsafe.load import load_spec
    from failsafe.network import trusted_region

    check_output(args.output, "--output", suffix=".json")
    spec = load_spec(Path(args.spec))
    if spec.model is None:
        raise InputError(f"{args.spec} names no decision model", location=args.spec,
                         hint="add `model: {path: ..., inputs: [...], outputs: [...]}` to the spec")
    model = replace(spec.model, path=str(Path(args.model).resolve())) if args.model else spec.model
    scenario = frozenset() if args.scenario in (None, "none") else frozenset(args.scenario.split("+"))
    unknown = sorted(scenario - {f.name for f in spec.faults})
    if unknown:
        raise InputError(f"--scenario names faults the spec does not declare: {', '.join(unknown)}",
                         location="--scenario", hint="faults: " + ", ".join(f.name for f in spec.faults))
    network = _network(spec, args.model)
    region = trusted_region(network, spec, scenario=scenario, mode=args.mode, grid=args.grid,
                            max_depth=args.depth)
    if args.output:
        Path(args.output).write_text(json.dumps(region.to_json(), indent=2) + "\n")
    counts = region.counts()
    if not args.quiet:
        sys.stderr.write(f"trusted region of {model.path} in scenario {region.label}: "
                         f"{region.coverage():.1%} of the box proved; cells: "
                         + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + "\n")
    return EXIT_UNDECIDED if counts.get("unknown") else EXIT_OK


def _action(actions: Any, name: str, help: str, *, policy: bool = False) -> Any:
    """A ``failsafe`` action reading a spec (and a policy), with the decision network it may name."""
    a = actions.add_parser(name, help=help, epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("spec", metavar="SPEC.yaml", help="the fail-safe spec (YAML; see failsafe/spec.schema.json)")
    if policy:
        a.add_argument("policy", metavar="POLICY.json", help="a policy written by `cuvil failsafe synth`")
    a.add_argument("--model", metavar="MODEL", help="the decision network (default: the spec's model path)")
    return a


def register(sub: Any) -> None:
    """Add ``failsafe`` (``synth``, ``check``, ``region``, ``simulate``) to the ``cuvil`` command's subparsers."""
    p = sub.add_parser("failsafe", help="synthesize and prove degraded-mode policies from a fail-safe spec")
    actions = p.add_subparsers(dest="failsafe_command", metavar="ACTION", required=True)
    s = _action(actions, "synth", "the best proved mode and parameters for every fault scenario")
    s.add_argument("-o", "--output", metavar="POLICY.json", help="write the policy (the input of `cuvil compile "
                                                                 "--failsafe` and `cuvil failsafe check`)")
    s.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                   help="seconds for the whole synthesis; what is left undecided is reported as unknown")
    add_report_arguments(s)
    s.add_argument("-q", "--quiet", action="store_true", help="no progress and no terminal summary")
    s.set_defaults(handler=cmd_synth)
    c = _action(actions, "check", "prove every entry of a policy file again against its spec", policy=True)
    add_report_arguments(c)
    c.add_argument("-q", "--quiet", action="store_true", help="no terminal summary")
    c.set_defaults(handler=cmd_check)
    r = _action(actions, "region", "where the spec's decision network provably keeps the invariants")
    r.add_argument("--scenario", metavar="FAULT+FAULT", help="the active faults (default: none)")
    r.add_argument("--mode", help="read the invariants under this mode's assumptions and definitions")
    r.add_argument("--grid", type=int, default=4, help="cells per input before refinement (default 4)")
    r.add_argument("--depth", type=int, default=6, help="bisections of an undecided cell (default 6)")
    r.add_argument("-o", "--output", metavar="REGION.json", help="write the cells with their verdicts")
    r.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    r.set_defaults(handler=cmd_region)
    m = _action(actions, "simulate", "random states and fault sequences under a policy; count violations",
                policy=True)
    m.add_argument("--steps", type=int, default=100_000, help="simulated steps (default 100000)")
    m.add_argument("--seed", type=int, default=0, help="the random seed (runs are reproducible)")
    m.add_argument("--json", metavar="FILE", help="write the counts as JSON")
    m.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    m.set_defaults(handler=cmd_simulate)
