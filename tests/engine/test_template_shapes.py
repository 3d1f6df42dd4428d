"""A chat template rendered once per shape and filled in gives exactly what rendering it in full gives, and a
template that looks at a content (a filter, a test, a condition) is always rendered in full."""
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from batchinfer.engine.loading.template_shapes import ShapeRenderer, contents_only_printed

pytestmark = pytest.mark.fast

SMOL = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
        "You are a helpful AI assistant<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>"
        "assistant\n' }}{% endif %}")
LOOKS_AT_CONTENT = {
    "filter": "{% for m in messages %}{{ m['content'] | trim }}|{% endfor %}",
    "condition": "{% for m in messages %}{% if m.content.startswith('x') %}X{% endif %}{{ m.content }}{% endfor %}",
    "assignment": "{% for m in messages %}{% set c = m['content'] %}{{ c }}{% endfor %}",
}
CONTENTS = ["Hi", "", "  spaced  ", "{{ not jinja }}", "x starts with x", "line\nbreak", "\x00odd\x00"]


def _renderer(source):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(source)
    return ShapeRenderer(template, contents_only_printed(source, env), {}), template


@pytest.mark.parametrize("roles", [("user",), ("system", "user"), ("system", "user", "assistant", "user")])
def test_a_shape_filled_in_equals_the_full_rendering(roles):
    renderer, template = _renderer(SMOL)
    for content in CONTENTS:
        messages = [{"role": r, "content": f"{content}{i}"} for i, r in enumerate(roles)]
        for opened in (True, False):
            assert renderer.render(messages, opened) == template.render(messages=messages, add_generation_prompt=opened)
    assert contents_only_printed(SMOL, ImmutableSandboxedEnvironment())


@pytest.mark.parametrize("kind", sorted(LOOKS_AT_CONTENT))
def test_a_template_that_looks_at_a_content_is_rendered_in_full(kind):
    renderer, template = _renderer(LOOKS_AT_CONTENT[kind])
    assert not contents_only_printed(LOOKS_AT_CONTENT[kind], ImmutableSandboxedEnvironment())
    for content in CONTENTS:
        messages = [{"role": "user", "content": content}]
        assert renderer.render(messages, True) == template.render(messages=messages, add_generation_prompt=True)


def test_a_content_printed_twice_falls_back_to_the_full_rendering():
    source = "{% for m in messages %}{{ m['content'] }}/{{ m['content'] }}{% endfor %}"
    renderer, template = _renderer(source)
    messages = [{"role": "user", "content": "twice"}]
    assert renderer.render(messages, False) == "twice/twice"
