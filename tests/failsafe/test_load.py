"""Reading fail-safe specs: the shipped examples load, and every malformed spec is a SpecError with
code CUVIL-FAILSAFE-SPEC at the line and column of the YAML node at fault (inside an expression, the
column of the part refused)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from failsafe.expr import MAX_DEPTH as MAX_EXPR_DEPTH
from failsafe.load import MAX_BYTES, MAX_NODES, SpecError, load_spec, spec_schema
from failsafe.spec import FAULT_KINDS, OBJECTIVES, Spec

EXAMPLES = Path(__file__).resolve().parents[2] / "failsafe" / "examples"

# A small valid spec; each case below replaces some of its lines (numbers 1-based, as in the errors).
BASE = """\
name: t
state:
  x: {range: [0, 10], unit: m}
  y: {range: [-1, 1]}
constants:
  k: 2
faults:
  f: {kind: sensor, nominal: "x <= 5", active: "x <= 8"}
modes:
  - name: a
    requires: "not f"
    parameters:
      p: {range: [0, 10], objective: maximize}
    assume: ["x <= p"]
  - name: b
    assume: "x <= 1"
invariants:
  safe: "x * k <= 20"
"""


def variant(replace: dict[int, str]) -> str:
    """BASE with line n replaced by ``replace[n]`` (which may hold several lines, or none)."""
    lines = BASE.splitlines()
    return "".join(f"{replace.get(i, line)}\n" if replace.get(i, line) else ""
                   for i, line in enumerate(lines, start=1))


def error_of(text: str | bytes, source: str = "t.yaml") -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(text, source=source)
    return info.value


def line_column(error: SpecError) -> tuple[int, int]:
    assert error.location is not None
    found = re.fullmatch(r".*:(\d+):(\d+)", error.location)
    assert found, error.location
    return int(found.group(1)), int(found.group(2))


def check(text: str | bytes, line: int, column: int, fragment: str) -> SpecError:
    error = error_of(text)
    assert error.code == "CUVIL-FAILSAFE-SPEC"
    assert error.location == f"t.yaml:{line}:{column}", (error.location, error.message)
    assert fragment in error.message, error.message
    return error


# ---- the shipped examples and valid specs ---------------------------------------------------------

@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_example_loads(path: Path) -> None:
    spec = load_spec(path)
    assert spec.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert spec.source == str(path)
    assert spec.modes and spec.invariants and spec.state
    # the last mode is the minimal-risk one: always available, nothing to choose
    assert spec.modes[-1].requires is None and spec.modes[-1].parameters == ()


def test_both_examples_are_shipped() -> None:
    assert {p.name for p in EXAMPLES.glob("*.yaml")} >= {"driving.yaml", "infusion.yaml"}


def test_driving_example_reads_as_written() -> None:
    spec = load_spec(EXAMPLES / "driving.yaml")
    assert [m.name for m in spec.modes] == ["nominal", "pull_over", "emergency_brake"]
    assert spec.state_var("speed").hi == 33.34 and spec.state_var("speed").unit == "m/s"
    assert {f.name: f.kind for f in spec.faults} == {"high_latency": "latency", "radar_lost": "sensor",
                                                    "input_out_of_box": "input-box",
                                                    "model_output_nonfinite": "non-finite"}
    nominal = spec.mode("nominal")
    assert nominal.parameters[0].name == "cap" and nominal.parameters[0].objective == "maximize"
    assert nominal.requires is not None and nominal.requires.names == {"input_out_of_box", "model_output_nonfinite"}
    (invariant,) = spec.invariants
    assert invariant.expr.names == {"speed", "latency", "decel", "distance", "margin"}
    assert all("decel" in m.define for m in spec.modes)
    # the closed form in the file's comment: the highest nominal cap with no fault is exactly 30 m/s
    env = {"speed": 30.0, "latency": 0.1, "distance": 80.0, "decel": 6.0, "margin": spec.constants["margin"]}
    assert bool(invariant.expr.evaluate(env))
    assert not bool(invariant.expr.evaluate({**env, "speed": 30.01}))


def test_infusion_example_reads_as_written() -> None:
    spec = load_spec(str(EXAMPLES / "infusion.yaml"))
    assert [m.name for m in spec.modes] == ["nominal", "reduced_rate", "stop_infusion"]
    assert {v.name for v in spec.state} >= {"weight", "rate", "elapsed", "concentration"}
    assert [i.name for i in spec.invariants] == ["hourly_dose", "cumulative_dose", "occlusion_bolus"]
    assert spec.constants == {"max_hourly_per_kg": 18.0, "max_daily_per_kg": 360.0, "max_bolus_per_kg": 5.0}
    weight_fault = next(f for f in spec.faults if f.name == "weight_out_of_range")
    assert weight_fault.kind == "input-box" and weight_fault.active is None
    assert weight_fault.nominal is not None and weight_fault.nominal.kind == "bool"


def test_base_spec_loads_into_the_data_model() -> None:
    spec = load_spec(BASE)
    assert isinstance(spec, Spec) and spec.name == "t" and spec.source == ""
    assert spec.digest == hashlib.sha256(BASE.encode()).hexdigest()
    assert [(v.name, v.lo, v.hi, v.unit) for v in spec.state] == [("x", 0.0, 10.0, "m"), ("y", -1.0, 1.0, "")]
    assert spec.constants == {"k": 2.0} and isinstance(spec.constants["k"], float)
    (fault,) = spec.faults
    assert (fault.kind, str(fault.nominal), str(fault.active)) == ("sensor", "x <= 5", "x <= 8")
    a, b = spec.modes
    assert str(a.requires) == "not f" and b.requires is None
    assert [(p.name, p.lo, p.hi, p.objective) for p in a.parameters] == [("p", 0.0, 10.0, "maximize")]
    assert [str(e) for e in a.assume] == ["x <= p"] and [str(e) for e in b.assume] == ["x <= 1"]
    assert spec.invariants[0].name == "safe" and spec.invariants[0].description == ""
    assert spec.model is None


def test_text_bytes_and_paths_give_the_same_spec(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(BASE)
    specs = [load_spec(BASE), load_spec(BASE.encode()), load_spec(path), load_spec(str(path))]
    assert len({s.digest for s in specs}) == 1
    assert len({(s.name, s.state, s.constants.get("k"), tuple(m.name for m in s.modes)) for s in specs}) == 1
    assert load_spec(path).source == str(path) and load_spec(BASE, source="inline").source == "inline"


def test_locations_name_the_file_the_spec_came_from(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(variant({6: "  k: two"}))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.location == f"{path}:6:6"


def test_definitions_read_earlier_ones_and_modes_read_their_parameters() -> None:
    text = variant({6: "  k: 2\ndefine:\n  d1: x * k\n  d2: d1 + y",
                    14: "    assume: [x <= p, d2 <= p + q]\n    define: {q: p / 2, r: q * 2}"})
    spec = load_spec(text)
    assert list(spec.define) == ["d1", "d2"] and spec.define["d2"].names == {"d1", "y"}
    assert list(spec.modes[0].define) == ["q", "r"]
    assert spec.modes[0].assume[1].names == {"d2", "p", "q"}


def test_same_parameter_name_in_two_modes_is_allowed() -> None:
    text = variant({16: "    assume: x <= p\n    parameters: {p: {range: [0, 1], objective: minimize}}"})
    spec = load_spec(text)
    assert [p.objective for m in spec.modes for p in m.parameters] == ["maximize", "minimize"]


def test_invariant_may_read_a_name_every_mode_provides() -> None:
    text = variant({16: "    assume: x <= 1\n    define: {p: 1}", 18: "  safe: {expr: x <= p, description: capped}"})
    spec = load_spec(text)
    assert spec.invariants[0].expr.names == {"x", "p"} and spec.invariants[0].description == "capped"


def test_spec_definitions_are_readable_in_fault_conditions() -> None:
    spec = load_spec(variant({6: "  k: 2\ndefine: {half: x / 2}", 8: "  f: {kind: other, nominal: half <= 5}"}))
    assert spec.faults[0].nominal is not None and spec.faults[0].nominal.names == {"half"}


def test_model_outputs_are_names_invariants_read() -> None:
    text = BASE + "model: {path: m.onnx, inputs: [y, x], outputs: [u]}\n"
    spec = load_spec(text.replace('safe: "x * k <= 20"', 'safe: "x * k <= 20 and u <= 1"'))
    assert spec.model is not None and spec.model.inputs == ("y", "x") and spec.model.outputs == ("u",)
    assert spec.invariants[0].expr.names == {"x", "k", "u"}


def test_requires_without_faults_and_constant_conditions() -> None:
    text = variant({7: "", 8: "", 11: "    requires: true"})
    spec = load_spec(text)
    assert spec.faults == () and str(spec.modes[0].requires) == "True"


def test_yaml_12_scalars() -> None:
    """yes/no/on/off are text (not YAML 1.1 booleans), 1e3 is a number, 0x10 an integer."""
    spec = load_spec(variant({3: "  x: {range: [0, 1e3], unit: on}", 6: "  k: 0x10"}))
    assert spec.state[0].hi == 1000.0 and spec.state[0].unit == "on" and spec.constants["k"] == 16.0
    assert load_spec(variant({3: "  x: {range: [0, 10], unit: no}"})).state[0].unit == "no"


def test_anchors_aliases_and_merge_keys() -> None:
    text = variant({3: "  x: &box {range: [0, 10], unit: m}", 4: "  y: {<<: *box, unit: s}",
                    13: "      p: {range: [0, 10], objective: maximize}"})
    spec = load_spec(text)
    assert [(v.lo, v.hi, v.unit) for v in spec.state] == [(0.0, 10.0, "m"), (0.0, 10.0, "s")]


# ---- wrong types, missing and unknown keys ----------------------------------------------------------

@pytest.mark.parametrize(("replace", "line", "column", "fragment"), [
    ({1: "name: [t]"}, 1, 7, "name must be text, not a list"),
    ({3: '  x: {range: "0..10", unit: m}'}, 3, 14, "state.x.range must be a list, not the text '0..10'"),
    ({6: "  k: two"}, 6, 6, "constants.k must be a number, not the text 'two'"),
    ({6: "  k: true"}, 6, 6, "constants.k must be a number, not true"),
    ({6: "  k:"}, 6, 5, "must be a number, not empty (null)"),
    ({14: "    assume: {x: 1}"}, 14, 13, "modes[0].assume must be a list, text or true/false, not a mapping"),
    ({14: "    assume: [[x <= p]]"}, 14, 14, "modes[0].assume[0] must be text, a number or true/false, not a list"),
    ({13: "      p: {range: [0, 10], objective: max}"}, 13, 38, "allowed: maximize, minimize, null"),
    ({8: "  f: {kind: broken}"}, 8, 13, f"allowed: {', '.join(FAULT_KINDS)}"),
    ({8: "  f: sensor"}, 8, 6, "faults.f must be a mapping, not the text 'sensor'"),
    ({9: "modes: {a: 1}", 10: "", 11: "", 12: "", 13: "", 14: "", 15: "", 16: ""}, 9, 8, "modes must be a list"),
    ({9: "modes: []", 10: "", 11: "", 12: "", 13: "", 14: "", 15: "", 16: ""}, 9, 8, "it takes at least 1"),
    ({18: "  safe: 3"}, 18, 9, "must be text, true/false or a mapping, not the number 3"),
    ({2: "state: {}", 3: "", 4: ""}, 2, 8, "state is empty; it needs at least 1 entry"),
    ({3: "  x: {range: [0, 1, 2]}"}, 3, 14, "has 3 items; it takes at most 2"),
    ({3: "  x: {range: [0]}"}, 3, 14, "has 1 item; it takes at least 2"),
    ({3: "  x: {range: [0, '10']}"}, 3, 18, "state.x.range[1] must be a number, not the text '10'"),
    ({1: "name: ''"}, 1, 7, "name is empty text"),
])
def test_wrong_types(replace: dict[int, str], line: int, column: int, fragment: str) -> None:
    check(variant(replace), line, column, fragment)


@pytest.mark.parametrize(("replace", "line", "column", "fragment"), [
    ({8: '  f: {nominal: "x <= 5"}'}, 8, 6, "faults.f is missing 'kind'"),
    ({4: "  y: {unit: m}"}, 4, 6, "state.y is missing 'range'"),
    ({15: "  - description: no name", 16: ""}, 15, 5, "modes[1] is missing 'name'"),
    ({17: "", 18: ""}, 1, 1, "the spec is missing 'invariants'"),
    ({1: "title: t"}, 1, 1, "unknown key 'title' in the spec"),
    ({5: "constant:"}, 5, 1, "unknown key 'constant' in the spec; did you mean 'constants'?"),
    ({3: "  x: {range: [0, 10], unti: m}"}, 3, 23, "unknown key 'unti' in state.x; did you mean 'unit'?"),
    ({12: "    params:"}, 12, 5, "unknown key 'params' in modes[0]; did you mean 'parameters'?"),
    ({10: "  - nme: a"}, 10, 5, "did you mean 'name'?"),  # the unknown key, not the missing one, is reported
    ({8: '  f: {kind: sensor, nominal: "x <= 5", xyzzy: 1}'}, 8, 40, "(allowed: active, description, kind"),
])
def test_missing_and_unknown_keys(replace: dict[int, str], line: int, column: int, fragment: str) -> None:
    check(variant(replace), line, column, fragment)


def test_the_first_problem_in_the_file_is_reported() -> None:
    """Schema errors are reported in file order (the validator walks the schema's order instead)."""
    text = "invariants:\n  safe: [1]\nname: t\nstate:\n  x: {range: oops}\nmodes: [{name: a}]\n"
    check(text, 2, 9, "invariants.safe must be text, true/false or a mapping, not a list")
    check(text.replace("safe: [1]", "safe: x <= 1"), 5, 14, "state.x.range must be a list")


# ---- names ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("replace", "line", "column", "fragment"), [
    ({4: "  x: {range: [-1, 1]}"}, 4, 3, "'x' is given twice in state (first on line 3)"),
    ({1: "name: t\nname: u"}, 2, 1, "'name' is given twice in the spec (first on line 1)"),
    ({6: "  x: 2"}, 6, 3, "'x' is both a state variable (line 3) and a constant"),
    ({6: "  f: 2"}, 8, 3, "'f' is both a constant (line 6) and a fault"),  # reported where the second one is
    ({13: "      y: {range: [0, 10], objective: maximize}"}, 13, 7,
     "'y' is both a state variable (line 4) and a parameter of mode 'a'"),
    ({14: "    assume: [x <= p]\n    define: {p: 1}"}, 15, 14,
     "'p' is both a parameter of mode 'a' (line 13) and a definition of mode 'a'"),
    ({6: "  k: 2\ndefine: {k: x}"}, 7, 10, "'k' is both a constant (line 6) and a definition"),
    ({15: "  - name: a"}, 15, 11, "mode 'a' is declared twice (first on line 10)"),
    ({4: "  2y: {range: [0, 1]}"}, 4, 3, "'2y' in state is not a name"),
    ({4: "  y-z: {range: [0, 1]}"}, 4, 3, "'y-z' in state is not a name"),
    ({4: "  lambda: {range: [0, 1]}"}, 4, 3, "'lambda' (state variable) is a reserved word"),
    ({6: "  min: 2"}, 6, 3, "'min' (constant) is a reserved word"),
    ({6: "  'true': 2"}, 6, 3, "'true' (constant) is a reserved word"),
    ({15: "  - name: b c"}, 15, 11, "modes[1].name is 'b c', not a name (ASCII letters"),
    ({18: "  not ok: x <= 1"}, 18, 3, "'not ok' in invariants is not a name"),
    ({6: "  1: 2"}, 6, 3, "the key '1' is not a name"),
    ({6: "  true: 2"}, 6, 3, "the key 'true' is not a name"),
    ({6: "  [a]: 2"}, 6, 3, "a list or mapping cannot be a key here"),
])
def test_names(replace: dict[int, str], line: int, column: int, fragment: str) -> None:
    check(variant(replace), line, column, fragment)


def test_model_names() -> None:
    model = "model: {path: m.onnx, inputs: [x, k], outputs: [u]}\n"
    check(BASE + model, 19, 35, "model input 'k' is not a state variable (state: x, y)")
    check(BASE + "model: {path: m.onnx, inputs: [x, x], outputs: [u]}\n", 19, 35,
          "model input 'x' is listed twice (first on line 19)")
    check(BASE + "model: {path: m.onnx, inputs: [x], outputs: [u, y]}\n", 19, 49,
          "'y' is both a state variable (line 4) and a model output")
    check(BASE + "model: {path: m.onnx, inputs: [x]}\n", 19, 8, "model is missing 'outputs'")


# ---- ranges and numbers -----------------------------------------------------------------------------

@pytest.mark.parametrize(("replace", "line", "column", "fragment"), [
    ({3: "  x: {range: [10, 0]}"}, 3, 14, "state.x.range is [10, 0]; a range needs lo < hi"),
    ({3: "  x: {range: [1, 1]}"}, 3, 14, "a range needs lo < hi"),
    ({3: "  x: {range: [0, .inf]}"}, 3, 18, "state.x.range[1] is inf; a range takes finite numbers"),
    ({3: "  x: {range: [-.inf, 0]}"}, 3, 15, "state.x.range[0] is -inf"),
    ({3: "  x: {range: [.nan, 0]}"}, 3, 15, "state.x.range[0] is nan"),
    ({3: "  x: {range: [0, 1" + "0" * 400 + "]}"}, 3, 18, "a range takes finite numbers"),
    ({13: "      p: {range: [5, 5]}"}, 13, 18, "modes[0].parameters.p.range is [5, 5]"),
    ({6: "  k: .nan"}, 6, 6, "constant 'k' is nan; constants are finite numbers"),
    ({6: "  k: !!int 12a"}, 6, 6, "'12a' is not a valid int"),
    ({6: "  k: !!float x"}, 6, 6, "'x' is not a valid float"),
])
def test_ranges_and_numbers(replace: dict[int, str], line: int, column: int, fragment: str) -> None:
    check(variant(replace), line, column, fragment)


def test_a_range_that_collapses_in_floating_point_is_refused() -> None:
    check(variant({3: f"  x: {{range: [{2 ** 60}, {2 ** 60 + 1}]}}"}), 3, 14, "a range needs lo < hi")


# ---- expressions --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("replace", "line", "column", "fragment"), [
    # the column inside the expression: an unknown name, a syntax error, a refused construct
    ({14: '    assume: ["x <= q"]'}, 14, 20, "unknown name 'q'"),
    ({14: "    assume: [x <= q]"}, 14, 19, "unknown name 'q'"),
    ({14: "    assume: ['  x <= q']"}, 14, 22, "unknown name 'q'"),
    ({8: '  f: {kind: sensor, nominal: "x <= 5 )"}'}, 8, 38, "unmatched ')'"),
    ({8: '  f: {kind: sensor, nominal: "x $ 5"}'}, 8, 33, "is not an expression"),
    ({18: '  safe: "x ** 0.5 <= 20"'}, 18, 10, "a power takes an integer exponent"),
    ({18: '  safe: "x <= (x > 1)"'}, 18, 10, "a comparison mixes numbers and conditions"),
    ({18: '  safe: "x <= k and y.real"'}, 18, 21, "Attribute is not allowed"),
    ({18: '  safe: "x <= __import__(1)"'}, 18, 15, "only min(...), max(...) and abs(x) can be called"),
    ({16: "    assume: |\n      x <= 1 and bogus"}, 17, 18, "unknown name 'bogus'"),
    ({16: "    assume: >-\n      x <= 1\n      and bogus"}, 16, 13, "unknown name 'bogus'"),  # folded: no column
    ({14: '    assume: ["x <=\\t q"]'}, 14, 14, "unknown name 'q'"),  # an escape: the scalar's start
    # names out of scope
    ({11: '    requires: "x > 1"'}, 11, 16, "unknown name 'x' (known: f)"),
    ({18: '  safe: "x <= 20 or f"'}, 18, 21, "unknown name 'f'"),
    ({8: '  f: {kind: sensor, nominal: "x <= p"}'}, 8, 36, "unknown name 'p'"),
    ({6: "  k: 2\ndefine: {a: b, b: 1}"}, 7, 13, "unknown name 'b'"),  # definitions are read in order
    ({18: '  safe: "x * p <= 20"'}, 18, 14, "reads 'p', which mode 'b' does not provide"),
    # kinds
    ({14: '    assume: ["x + p"]'}, 14, 14, "'x + p' is a number, where a condition (true/false) is expected"),
    ({11: "    requires: f or 1"}, 11, 20, "'1' is a number, a condition (true/false) is needed here"),
    ({16: "    assume: 3"}, 16, 13, "modes[1].assume must be a list, text or true/false, not the number 3"),
    ({6: "  k: 2\ndefine: {d: x > 1}"}, 7, 13, "is a condition (true/false), where a number is expected"),
    ({8: "  f: {kind: sensor, active: x}"}, 8, 29, "is a number, where a condition"),
    ({18: "  safe: {expr: x + 1, description: d}"}, 18, 16, "invariants.safe.expr: 'x + 1' is a number"),
])
def test_expressions(replace: dict[int, str], line: int, column: int, fragment: str) -> None:
    check(variant(replace), line, column, fragment)


def test_expression_limits() -> None:
    deep = "-" * (MAX_EXPR_DEPTH + 5) + "x <= 1"
    check(variant({16: f"    assume: '{deep}'"}), 16, 13, f"nests deeper than {MAX_EXPR_DEPTH} levels")
    deeper = "-" * 1990 + "x <= 1"  # deeper than Python's parser recursion, within the length limit
    check(variant({16: f"    assume: '{deeper}'"}), 16, 13, "nests")
    check(variant({16: f"    assume: '{'x + ' * 500}x <= 1'"}), 16, 13, "characters long; at most 2,000")


# ---- faults -------------------------------------------------------------------------------------------

def test_one_fault_of_each_guard_kind() -> None:
    text = variant({8: "  f: {kind: input-box}\n  g: {kind: non-finite}\n  h: {kind: input-box}"})
    check(text, 10, 13, "faults 'f' (line 8) and 'h' are both of kind input-box")
    assert len(load_spec(variant({8: "  f: {kind: input-box}\n  g: {kind: non-finite}"})).faults) == 2


# ---- hostile YAML -------------------------------------------------------------------------------------

def test_python_tags_are_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    check(f'name: !!python/object/apply:os.system ["touch {marker}"]\n', 1, 7,
          "the tag !!python/object/apply:os.system is not allowed")
    check(f"name: !!python/object/new:os.system [touch {marker}]\n", 1, 7, "!!python/object/new:os.system")
    check("name: !!python/name:os.system ''\n", 1, 7, "!!python/name:os.system")
    check(variant({4: "  y: !!python/object:builtins.dict {range: [0, 1]}"}), 4, 6, "!!python/object:builtins.dict")
    assert not marker.exists()


@pytest.mark.parametrize(("text", "line", "column", "fragment"), [
    ("name: !!binary aGVsbG8=\n", 1, 7, "the tag !!binary"),
    ("name: !!timestamp 2024-01-01\n", 1, 7, "the tag !!timestamp"),
    ("name: !!set {a, b}\n", 1, 7, "the tag !!set"),
    ("name: !!omap [a: 1]\n", 1, 7, "the tag !!omap"),
    ("name: !local x\n", 1, 7, "the tag !local"),
])
def test_other_tags_are_refused(text: str, line: int, column: int, fragment: str) -> None:
    check(text, line, column, fragment)


def test_alias_bomb_is_refused_before_it_expands() -> None:
    bomb = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level, name in enumerate("bcdefghi"):
        previous = "abcdefghi"[level]
        bomb.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    error = error_of("\n".join(bomb) + "\n")
    assert error.code == "CUVIL-FAILSAFE-SPEC"
    assert f"more than {MAX_NODES:,} YAML nodes once aliases are expanded" in error.message
    line, _ = line_column(error)
    assert 1 <= line <= len(bomb)


def test_alias_cycles_and_deep_nesting_are_refused() -> None:
    check("name: &a [*a]\n", 1, 7, "nests deeper than 64 levels once aliases are expanded")
    check("name: " + "[" * 100 + "]" * 100 + "\n", 1, 70, "nests deeper than 64 levels")
    chain = ["a0: &a0 [1]", *[f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, 80)]]
    error = error_of("\n".join(chain) + "\n")
    assert "nests deeper than 64 levels once aliases are expanded" in error.message


def test_too_many_nodes_is_refused_while_reading() -> None:
    # reported at the first item past the limit: the mapping, its key and the list count too
    check("name: [" + ", ".join(["1"] * (MAX_NODES + 10)) + "]\n", 1, 8 + 3 * (MAX_NODES - 3), "more than 10,000")


def test_over_large_spec_is_refused(tmp_path: Path) -> None:
    text = BASE + "#" * MAX_BYTES + "\n"
    check(text, 1, 1, f"larger than {MAX_BYTES:,} bytes")
    path = tmp_path / "big.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="larger than") as info:
        load_spec(path)
    assert info.value.location == f"{path}:1:1"
    assert load_spec(BASE + "#" * (MAX_BYTES - len(BASE) - 2) + "\n").name == "t"  # just under the limit loads


@pytest.mark.parametrize(("text", "line", "column", "fragment"), [
    ("", 1, 1, "the spec is empty"),
    ("   \n\n", 1, 1, "the spec is empty"),
    ("# a comment only\n", 1, 1, "the spec is empty"),
    ("- name: t\n", 1, 1, "the spec must be a mapping, not a list"),
    ("just text\n", 1, 1, "the spec must be a mapping, not the text 'just text'"),
    ("42\n", 1, 1, "the spec must be a mapping, not the number 42"),
    ("null\n", 1, 1, "the spec must be a mapping, not empty (null)"),
    ("name: t\n---\nname: u\n", 2, 1, "expected a single document"),
    ("name: [t\nstate: {}\n", 2, 6, "not valid YAML"),
    ("name: t\n\tstate: {}\n", 2, 1, "not valid YAML"),
    ("name: t\n  state: {}\n", 2, 8, "not valid YAML"),
    ("name: *nowhere\n", 1, 7, "found undefined alias 'nowhere'"),
    ("name: t\x00\n", 1, 8, "character U+0000 is not allowed"),
    ("name: a\nstate: {x: {<<: 3}}\n", 2, 17, "a merge (<<) takes a mapping or a list of mappings"),
])
def test_malformed_documents(text: str, line: int, column: int, fragment: str) -> None:
    check(text, line, column, fragment)


def test_bytes_that_are_not_utf8() -> None:
    check(b"name: t\nstate: \xff\xfe\n", 2, 8, "not UTF-8 text (byte 0xff)")
    check("name: caf\u00e9\nx: \udc80\n", 2, 4, "not UTF-8 text")  # a lone surrogate in text input


def test_unreadable_paths(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read the spec") as info:
        load_spec(tmp_path / "missing.yaml")
    assert info.value.location == str(tmp_path / "missing.yaml") and info.value.code == "CUVIL-FAILSAFE-SPEC"
    with pytest.raises(SpecError, match="cannot read the spec"):
        load_spec(tmp_path)
    for name in ("nope.yml", "nope.txt", "nope"):  # a one-line string without ':' is a path
        with pytest.raises(SpecError, match="cannot read the spec"):
            load_spec(str(tmp_path / name))


def test_errors_render_with_code_location_and_hint() -> None:
    error = error_of(variant({6: "  x: 2"}))
    text = str(error)
    assert text.startswith("[CUVIL-FAILSAFE-SPEC] 'x' is both a state variable (line 3) and a constant (at t.yaml:6:3)")
    assert "hint:" in text


# ---- the schema -----------------------------------------------------------------------------------------

def test_schema_is_valid_draft_2020_12() -> None:
    schema = spec_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_schema_describes_every_property() -> None:
    """Every property and definition has a description (a value schema that only refers to a
    definition takes the definition's)."""
    undocumented = []
    stack: list[tuple[str, dict[str, Any]]] = [("/", spec_schema())]
    while stack:
        where, node = stack.pop()
        if "description" not in node:
            undocumented.append(where)
        for key in ("properties", "$defs"):
            stack += [(f"{where}{key}/{name}/", sub) for name, sub in node.get(key, {}).items()]
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and set(extra) != {"$ref"}:
            stack.append((f"{where}additionalProperties/", extra))
    assert undocumented == []


def test_schema_enums_follow_the_data_model() -> None:
    defs = spec_schema()["$defs"]
    assert tuple(defs["fault"]["properties"]["kind"]["enum"]) == FAULT_KINDS
    assert tuple(v for v in defs["parameter"]["properties"]["objective"]["enum"] if v is not None) == OBJECTIVES


def test_examples_validate_against_the_schema_alone() -> None:
    """The schema is usable on its own (by editors): the examples, read as plain YAML, pass it."""
    import yaml

    validator = jsonschema.Draft202012Validator(spec_schema())
    for path in EXAMPLES.glob("*.yaml"):
        assert list(validator.iter_errors(yaml.safe_load(path.read_text()))) == []


def test_a_mode_may_define_a_model_output_to_stand_in_for_the_network() -> None:
    """Simplex: the fallback mode's definition of a network output replaces the network there; any other
    section naming a model output still collides."""
    text = """
name: stand-in
state: {v: {range: [0, 10]}}
faults: {}
modes:
  - name: nominal
  - name: fallback
    define: {u: "v + 1"}
invariants: {ok: "u >= v"}
model: {path: net.onnx, inputs: [v], outputs: [u]}
"""
    spec = load_spec(text)
    assert "u" in spec.modes[1].define and spec.model is not None and spec.model.outputs == ("u",)
    with pytest.raises(SpecError, match="'u' is both"):
        load_spec(text.replace("faults: {}", "faults: {}\nconstants: {u: 1}"))
