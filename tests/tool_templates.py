"""Chat templates of our own that carry each family's tool format (as Qwen's, Llama 3.1's and Mistral's do), written
for the tests: tools listed with tojson, earlier calls and tool results placed as each family places them."""

HERMES = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    'Call a function as <tool_call>{"name": <name>, "arguments": <args>}</tool_call><|im_end|>\n{% endif %}'
    "{%- for message in messages %}{%- if message.role == 'system' and tools %}{% continue %}{% endif %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n{{ message.content }}"
    "{% for call in message.tool_calls %}<tool_call>\n"
    '{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}\n</tool_call>{% endfor %}'
    "<|im_end|>\n{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

LLAMA3_JSON = (
    "{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nRespond with a JSON for a function call: "
    '{"name": function name, "parameters": dictionary of argument name and its value}.\n'
    "{% for t in tools %}{{ t | tojson(indent=4) }}\n{% endfor %}<|eot_id|>{% endif %}"
    "{% for message in messages %}{% if message.role == 'assistant' and message.tool_calls %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% for call in message.tool_calls %}"
    '{{ {"name": call.function.name, "parameters": call.function.arguments} | tojson }}{% endfor %}<|eot_id|>'
    "{% elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ message.content }}<|eot_id|>"
    "{% else %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n{{ message.content }}<|eot_id|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")

MISTRAL = (
    "{% for message in messages %}{% if message.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS]"
    "{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ message.content }}[/INST]"
    "{% elif message.role == 'assistant' and message.tool_calls %}[TOOL_CALLS]"
    "{{ message.tool_calls | map(attribute='function') | list | tojson }}</s>"
    "{% elif message.role == 'tool' %}[TOOL_RESULTS]{{ {'call_id': message.tool_call_id, 'content': message.content} "
    "| tojson }}[/TOOL_RESULTS]{% else %}{{ message.content }}</s>{% endif %}{% endfor %}")

TEMPLATES = {"hermes": HERMES, "llama3_json": LLAMA3_JSON, "mistral": MISTRAL}

# Qwen3's way of thinking: the template opens an empty thought when enable_thinking is false, and writes <think> itself
THINKING = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}")
