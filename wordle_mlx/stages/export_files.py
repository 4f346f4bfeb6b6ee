"""The text files `wordle-mlx export` writes beside the GGUF: the Ollama Modelfile and the llama.cpp usage notes.

The Modelfile (`NAME.Modelfile`) has Gemma's chat template as an Ollama template, the system line the adapter
was trained with, `<end_of_turn>` as stop token and temperature 0 (greedy play); Ollama takes no GBNF grammar,
so it plays the model's free decoding. The usage notes (`NAME.llamacpp.md`) say which decoding the player was
trained for and how to play it: llama.cpp's command line with `--grammar-file NAME.gbnf`, llama-server's
request with the grammar and the logit bias (`NAME.logit_bias.json`, the tokens a reply never takes), the
llama-cpp-python lines, a board's own grammar in words decoding (`wordle-mlx grammar --board`), which runtimes
cannot take the logit bias (llama-cli, Ollama), and the Ollama commands (or why no Modelfile was written).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

STOP_PIECE = "<end_of_turn>"
USAGE_SUFFIX = ".llamacpp.md"
LOGIT_BIAS_SUFFIX = ".logit_bias.json"

# Gemma 3's chat template (tokenizer_build.GEMMA3_CHAT_TEMPLATE) in Ollama's Go template language: the
# system line opens the first user turn, followed by a blank line. Ollama adds <bos> itself.
OLLAMA_TEMPLATE = """{{- $system := "" }}
{{- range $i, $m := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq $m.Role "system" }}{{ $system = $m.Content }}
{{- else if eq $m.Role "user" }}<start_of_turn>user
{{ if $system }}{{ $system }}

{{ $system = "" }}{{ end }}{{ $m.Content }}<end_of_turn>
{{ if $last }}<start_of_turn>model
{{ end }}
{{- else if eq $m.Role "assistant" }}<start_of_turn>model
{{ $m.Content }}{{ if not $last }}<end_of_turn>
{{ end }}
{{- end }}
{{- end }}"""

GRAMMAR_NOTES = {
    "grammar": "The grammar fixes the reply's tags and lets each of the 5 letters be any a-z, as wordle-mlx's "
               "grammar decoding does; a reply may spell a word the game rejects.",
    "words": "The grammar limits the 5 letters to the allowed guesses. A grammar file is the same on every turn, so "
             "unlike wordle-mlx's words decoding it cannot rule out the words already on the board: for that, give "
             "each turn the grammar of its board (below), or the player may repeat a guess.",
}


def modelfile_text(gguf_name: str, system: str, example: str, source: str) -> str:
    return (f"# Ollama Modelfile for {gguf_name}, written by `wordle-mlx export` ({source}).\n"
            f"#   ollama create wordle -f {Path(gguf_name).stem}.Modelfile && ollama run wordle\n"
            f"# Each message is the board as the player was trained to read it, e.g. {example!r}.\n"
            f"FROM ./{gguf_name}\n"
            f'TEMPLATE """{OLLAMA_TEMPLATE}"""\n'
            f'SYSTEM """{system}"""\n'
            f'PARAMETER stop "{STOP_PIECE}"\n'
            "PARAMETER temperature 0\n")


def shell_quote(text: str) -> str:
    """`text` as one shell word; with newlines, bash's $'...' form."""
    if "\n" not in text:
        return shlex.quote(text)
    return "$'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def usage_text(gguf_name: str, source: str, mode: str, recorded: str | None, grammar_name: str | None,
               system: str, board: str, bias_name: str | None, model: str, modelfile_name: str | None,
               no_modelfile_reason: str | None) -> str:
    """The usage notes for one export (see the module docstring); `mode` is the decoding the player plays."""
    where = "records" if recorded else "records no decoding; the default is"
    grammar_flag = f" --grammar-file {grammar_name}" if grammar_name else ""
    lines = [f"# Playing {gguf_name} in llama.cpp and Ollama", "",
             f"Written by `wordle-mlx export` ({source}). The adapter {where} {mode} decoding"
             + (f": in llama.cpp, constrain each reply with the GBNF grammar `{grammar_name}`. {GRAMMAR_NOTES[mode]}"
                if grammar_name else ": the model writes its reply unconstrained, so no grammar is written."), ""]
    if bias_name:
        lines += [f"A grammar constrains text, not tokens: llama.cpp could spell a letter as a bare space and a letter, "
                  f"which wordle-mlx never does, and play on differently. `{bias_name}` bans every token a reply never "
                  "takes (all but the tags, the 26 letter tokens and the end of turn), in llama-server's `logit_bias` "
                  "form; pass it with the grammar to play exactly as wordle-mlx decodes. llama-cli takes a logit bias "
                  "one `--logit-bias` flag per token, too many for this list, and Ollama takes none: there the grammar "
                  "alone applies.", ""]
    lines += [f"Each turn is one user message, the board as the player was trained to read it (e.g. {board!r}), "
              f"after the system line {system!r}. Play greedily (temperature 0); a reply is at most 16 tokens.", ""]
    if mode == "words":
        lines += ["## A board's own grammar", "",
                  "From the second turn on, rule out the words already on the board with that board's grammar:",
                  "", "```console",
                  f"$ wordle-mlx grammar --model {shlex.quote(model)} --board crane,sloth > board.gbnf", "```", "",
                  "and use `board.gbnf` in place of the grammar file for that turn.", ""]
    lines += ["## llama.cpp", "", "```console",
              f"$ llama-cli -m {gguf_name}{grammar_flag} --temp 0 -st -sys {shell_quote(system)} -p {shell_quote(board)}",
              f"$ llama-server -m {gguf_name}"]
    grammar_field = '"grammar": $g, ' if grammar_name else ""
    bias_field = '"logit_bias": $bias[0], ' if bias_name else ""
    body = ('{"messages": [{"role": "system", "content": $sys}, {"role": "user", "content": $board}], '
            f'{grammar_field}{bias_field}"temperature": 0, "max_tokens": 16}}')
    files = (f"--rawfile g {grammar_name} " if grammar_name else "") + (f"--slurpfile bias {bias_name} " if bias_name else "")
    lines += [f"$ jq -n {files}--arg sys {shell_quote(system)} --arg board {shell_quote(board)} {shlex.quote(body)} \\",
              "    | curl -s http://localhost:8080/v1/chat/completions -H 'Content-Type: application/json' -d @-",
              "```", ""]
    if grammar_name:
        lines += ["llama-server takes the grammar in each request's `grammar` field"
                  + (" and the bias in its `logit_bias` field" if bias_name else "") + ", as above.", ""]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": board}]
    lines += ["## llama-cpp-python", "", "```python"]
    if bias_name:
        lines += ["import json", "", "import numpy as np",
                  "from llama_cpp import Llama, LlamaGrammar, LogitsProcessorList", "",
                  f"llm = Llama(model_path={gguf_name!r}, n_ctx=2048, verbose=False)",
                  f"banned = np.array([token for token, _ in json.load(open({bias_name!r}))])",
                  "", "def canonical(input_ids, scores):   # the logit bias, as one numpy assignment",
                  "    scores[banned] = -np.inf", "    return scores", ""]
    else:
        lines += ["from llama_cpp import Llama" + (", LlamaGrammar" if grammar_name else ""), "",
                  f"llm = Llama(model_path={gguf_name!r}, n_ctx=2048, verbose=False)"]
    if grammar_name:
        lines.append(f"grammar = LlamaGrammar.from_file({grammar_name!r})")
    extra = (", grammar=grammar" if grammar_name else "") + (
        ",\n                              logits_processor=LogitsProcessorList([canonical])" if bias_name else "")
    lines += [f"messages = {json.dumps(messages)}",
              f"reply = llm.create_chat_completion(messages=messages, temperature=0, max_tokens=16{extra})",
              'print(reply["choices"][0]["message"]["content"])', "```", "", "## Ollama", ""]
    if modelfile_name:
        lines += ["```console", f"$ ollama create wordle -f {modelfile_name} && ollama run wordle", "```", "",
                  "Ollama takes no GBNF grammar and no logit bias: it plays the model's free decoding, and the adapter "
                  "records nothing against that (its reply tags were trained, or it predates the record)."]
    else:
        lines.append(f"No Modelfile was written: {no_modelfile_reason}.")
    return "\n".join(lines) + "\n"
