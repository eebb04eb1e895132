"""The OpenAI doors' ``model`` rename: the route's name in place of the upstream's model, in the JSON
field only, learnt from the first chunk that names a model."""

from __future__ import annotations

from gateway.doors.openai import ModelRenamer


def test_the_model_field_is_renamed_in_either_spelling() -> None:
    tight = ModelRenamer("moonshotai/Kimi-K3", "kimi-k3")
    assert (
        tight.translate(b'data: {"id":"x","model":"moonshotai/Kimi-K3"}\n\n')
        == b'data: {"id":"x","model":"kimi-k3"}\n\n'
    )
    assert (
        tight.translate(b'data: {"model":"moonshotai/Kimi-K3","c":1}\n\n')
        == b'data: {"model":"kimi-k3","c":1}\n\n'
    )
    spaced = ModelRenamer("m", "route")
    assert spaced.translate(b'{"model": "m"}') == b'{"model": "route"}'


def test_generated_text_that_quotes_the_field_is_left_alone() -> None:
    renamer = ModelRenamer("m", "route")
    text = b'{"model":"m","content":"say \\"model\\":\\"m\\" twice"}'
    assert renamer.translate(text) == b'{"model":"route","content":"say \\"model\\":\\"m\\" twice"}'


def test_an_upstream_that_names_another_model_keeps_its_name() -> None:
    renamer = ModelRenamer("paced", "bench-paced")
    assert renamer.translate(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"  # names none: still learning
    alias = b'data: {"model":"served-alias","choices":[]}\n\n'
    assert renamer.translate(alias) == alias
    assert renamer._old == b""  # settled: later chunks are not searched
    assert renamer.translate(b'{"model":"paced"}') == b'{"model":"paced"}'
