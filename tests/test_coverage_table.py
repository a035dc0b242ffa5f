"""The coverage table (scripts/coverage): its rows, its tiny configs, a few of its cells, its page (docs/coverage.md).

The suite runs BERT and GPT-2 (base class and one head, both frontends, and one build) and
the markdown round trip; ``slow`` runs every row of the table, one test per architecture,
and holds it to issue #15's "done when": every class traces and matches eager with both
frontends, and the architecture builds end to end.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from scripts.coverage import render
from scripts.coverage.architectures import ALSO_REQUIRED, HF_TRACER_4_53, architectures, exists_in_transformers
from scripts.coverage.cells import TRACERS, build_end_to_end, build_model
from scripts.coverage.isolated import run_all
from scripts.coverage.run import COVERAGE_JSON, PAGE, fill, main
from scripts.coverage.tiny_config import tiny_config

ROWS = {row.model_type: row for row in architectures()}


def test_rows_are_the_4_53_list_still_in_transformers_and_the_newer_ones():
    assert len(HF_TRACER_4_53) == 54 and "glm" not in HF_TRACER_4_53, "4.53.0's list: 54 types, glm already dropped"
    assert not exists_in_transformers("nezha"), "precondition: a 4.53 type that transformers 5 removed"
    assert "nezha" not in ROWS
    wanted = {t for t in HF_TRACER_4_53 if exists_in_transformers(t)} | set(ALSO_REQUIRED)
    assert wanted <= set(ROWS), sorted(wanted - set(ROWS))


def test_classes_come_from_the_auto_mappings_base_first():
    from transformers.models.auto.modeling_auto import MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES

    assert MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES["bert"] == "BertForMultipleChoice", "precondition"
    bert = ROWS["bert"]
    assert bert.classes[0] == "BertModel" and bert.base_classes == ("BertModel",)
    assert "BertForMultipleChoice" in bert.classes and len(set(bert.classes)) == len(bert.classes)
    assert "GPT2DoubleHeadsModel" in ROWS["gpt2"].classes, "4.53's special-cased classes join their row"
    assert ROWS["git"].classes == ("GitVisionModel",), "a type only special-cased gets that class alone"


@pytest.mark.parametrize("model_type", ["bert", "gpt2", "swin", "clip"])
def test_tiny_configs_are_tiny(model_type):
    model = build_model(model_type, ROWS[model_type].classes[0])
    assert 0 < sum(p.numel() for p in model.parameters()) < 500_000
    config = tiny_config(model_type)
    text = getattr(config, "text_config", config)
    assert getattr(text, "num_hidden_layers", 2) == 2


@pytest.mark.artifact
@pytest.mark.parametrize("frontend", ["fx", "export"])
@pytest.mark.parametrize("model_type, class_name", [
    ("bert", "BertModel"), ("bert", "BertForSequenceClassification"), ("gpt2", "GPT2Model"), ("gpt2", "GPT2LMHeadModel"),
])
def test_cells_trace_and_match_eager(model_type, class_name, frontend):
    assert class_name in ROWS[model_type].classes
    TRACERS[frontend](model_type, class_name)  # raises where a shape differs from eager


class _OffByOne(torch.nn.Module):
    """A traced graph whose last_hidden_state is eager's plus one."""

    def __init__(self, graph_module):
        super().__init__()
        self.graph_module = graph_module

    def forward(self, **inputs):
        outputs = self.graph_module(**inputs)
        return {name: value + 1 if name == "last_hidden_state" else value for name, value in outputs.items()}


def test_a_cell_that_differs_from_eager_raises(monkeypatch):
    from scripts.coverage import cells

    traced = cells.symbolic_trace
    cells.trace_fx("bert", "BertModel")  # precondition: the faithful graph passes
    monkeypatch.setattr(cells, "symbolic_trace", lambda model: _OffByOne(traced(model)))
    with pytest.raises(cells.Mismatch, match="last_hidden_state"):
        cells.trace_fx("bert", "BertModel")


@pytest.mark.full  # transformers' exporter and ONNX Runtime on two architectures: the coverage table's own column
@pytest.mark.parametrize("model_type, class_name", [("bert", "BertModel"), ("gpt2", "GPT2LMHeadModel")])
def test_transformers_own_exporter_is_a_column_checked_in_onnx_runtime(model_type, class_name):
    pytest.importorskip("transformers.exporters", reason="transformers' exporter ships from 5.24")
    TRACERS["hf_onnx"](model_type, class_name)  # raises where ONNX Runtime's outputs differ from eager's


@pytest.mark.full  # tiny BERT builds end to end in the artifact tier already (tests/test_cli.py, the shipped recipes)
def test_bert_builds_end_to_end():
    build_end_to_end("bert", "BertForSequenceClassification", "fx")


def _sleep():
    time.sleep(30)


def _die():
    os._exit(3)


def _raise():
    raise ValueError("first line\nsecond line")


def test_a_hang_or_a_crash_stops_its_own_cell_only():
    jobs = [("hang", _sleep, ()), ("crash", _die, ()), ("raise", _raise, ()), ("fine", int, ())]
    outcomes = dict(run_all(jobs, workers=2, timeout_s=2))
    assert outcomes["hang"].error == "timed out after 2 s"
    assert "exited with 3" in outcomes["crash"].error
    assert outcomes["raise"].error == "ValueError: first line"
    assert outcomes["fine"].ok and outcomes["fine"].error is None


@pytest.mark.artifact
def test_a_run_merges_into_the_earlier_table(tmp_path):
    output = tmp_path / "coverage.json"
    earlier = {"GPT2Model": {"fx": {"ok": False, "error": "old", "seconds": 0}}}
    output.write_text(json.dumps({"architectures": {"gpt2": {"classes": earlier}}}))
    assert main(["--only", "bert", "--frontends", "fx", "--no-build", "--workers", "2", "--output", str(output)]) == 0
    data = json.loads(output.read_text())
    bert = data["architectures"]["bert"]
    assert set(bert["classes"]) == set(ROWS["bert"].classes)
    assert all(cells["fx"]["ok"] for cells in bert["classes"].values()), bert
    assert all("export" not in cells for cells in bert["classes"].values())
    assert data["architectures"]["gpt2"]["classes"]["GPT2Model"]["fx"]["error"] == "old", "rows not run are kept"
    assert list(data["architectures"]) == ["bert", "gpt2"], "rows in the table's order"


def _table() -> dict:
    ok = {"ok": True, "error": None, "seconds": 1.0}
    bad = {"ok": False, "error": "TraceError: a | b", "seconds": 1.0}
    return {
        "transformers": "5.x", "torch": "2.x", "shapes": [[2, 16], [3, 11]], "gone_in_transformers_5": ["nezha"],
        "architectures": {
            "bert": {"in_hf_tracer_4_53": True, "classes": {"BertModel": {"fx": ok, "export": ok, "hf_onnx": ok},
                                                           "BertForX": {"fx": bad, "export": ok}},
                     "build": {"class": "BertModel", "frontend": "fx", **ok}},
            "gemma": {"in_hf_tracer_4_53": False, "classes": {"GemmaModel": {"fx": ok, "export": bad, "hf_onnx": {**bad, "error": "hf"}}},
                      "build": {"class": "GemmaModel", "frontend": "fx", **bad}},
        },
    }


def test_markdown_counts_and_groups_failures():
    markdown = render.render_markdown(_table())
    assert "**fx: 2/3 classes · export: 2/3 classes · build: 1/2 architectures · transformers' exporter: 1/2 classes**" in markdown
    assert "| bert | ✓ | 2 | 1/2 ✗ BertForX | 2/2 | ✓ BertModel (fx) | 1/1 |" in markdown
    assert "| gemma |  | 1 | 1/1 | 0/1 ✗ GemmaModel | ✗ GemmaModel (fx) | 0/1 ✗ GemmaModel |" in markdown
    assert "| TraceError: a \\| b | bert/BertForX (fx), gemma/GemmaModel (export), gemma/GemmaModel (build, fx) |" in markdown


def test_one_cause_in_many_classes_is_one_group():
    table = _table()
    table["architectures"]["bert"]["classes"]["BertForX"]["fx"]["error"] = "TraceError: no dummy input for BertForX"
    gemma = table["architectures"]["gemma"]["classes"]["GemmaModel"]
    gemma["export"] = {"ok": False, "error": "TraceError: no dummy input for GemmaModel"}
    groups = render.failures_by_error(table)
    assert groups["TraceError: no dummy input for {class}"] == ["bert/BertForX (fx)", "gemma/GemmaModel (export)"]


def test_page_section_round_trip_keeps_every_other_line(tmp_path):
    text = PAGE.read_text(encoding="utf-8")
    assert text.count(render.START) == 1 and text.count(render.END) == 1, "docs/coverage.md holds one coverage section"
    copy = tmp_path / "coverage.md"
    copy.write_text(text, encoding="utf-8")
    markdown = render.render_markdown(_table())
    render.rewrite_page(copy, markdown)
    once = copy.read_text(encoding="utf-8")
    before, after = text.split(render.START)[0], text.split(render.END)[1]
    assert once.startswith(before + render.START + "\n" + markdown + "\n" + render.END) and once.endswith(after)
    render.rewrite_page(copy, markdown)
    assert copy.read_text(encoding="utf-8") == once, "regenerating the same table changes nothing"
    with pytest.raises(ValueError, match="coverage:start"):
        render.replace_section("no markers here", markdown)


def test_the_page_shows_what_coverage_json_holds():
    data = json.loads(COVERAGE_JSON.read_text(encoding="utf-8"))
    assert data["architectures"], "precondition: coverage.json holds rows"
    text = PAGE.read_text(encoding="utf-8")
    shown = text.split(render.START)[1].split(render.END)[0]
    assert shown == "\n" + render.render_markdown(data) + "\n", "run python -m scripts.coverage.run --page-only"


@pytest.mark.coverage_table  # opt-in (pyproject): the cells that fail are the coverage issue's open work
@pytest.mark.parametrize("model_type", list(ROWS))
def test_architecture_traces_with_both_frontends_and_builds(model_type):
    data = {"architectures": {}}
    fill([ROWS[model_type]], data, ["fx", "export"], build=True, workers=2)
    row = data["architectures"][model_type]
    assert set(row["classes"]) == set(ROWS[model_type].classes), "every class has its cells"
    failing = [f"{name} ({frontend}): {cell['error']}" for name, cells in row["classes"].items()
               for frontend, cell in cells.items() if not cell["ok"]]
    if not row["build"]["ok"]:
        failing.append(f"build of {row['build']['class']} ({row['build']['frontend']}): {row['build']['error']}")
    assert not failing, "\n".join(failing)
