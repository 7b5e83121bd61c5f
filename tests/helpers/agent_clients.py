"""The official SDKs against an OpenAI- and Anthropic-compatible endpoint, as coding agents and chat apps call it:
run with the vLLM engine venv's Python, which has both (vLLM depends on openai and anthropic). Prints one JSON
object: for each call, its API and the usage the SDK read (prompt, completion), or the error it raised.

  python agent_clients.py BASE_URL KEY MODEL
"""

from __future__ import annotations

import json
import sys

import anthropic
import openai


def main(base: str, key: str, model: str) -> dict:
    calls: dict[str, object] = {}
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=300)
    messages = [{"role": "user", "content": "What is the capital of France?"}]

    def record(name: str, api: str, run) -> None:
        try:
            prompt, completion, text = run()
            calls[name] = {"api": api, "prompt": prompt, "completion": completion, "text": text}
        except Exception as error:  # the test names the call and the SDK's error
            calls[name] = {"api": api, "error": f"{type(error).__name__}: {error}"}

    def chat():
        answer = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
        return answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.choices[0].message.content

    def chat_stream():
        usage, text = None, ""
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )
        for chunk in stream:
            text += "".join(choice.delta.content or "" for choice in chunk.choices)
            usage = chunk.usage or usage
        return usage.prompt_tokens, usage.completion_tokens, text

    def responses():
        answer = client.responses.create(model=model, input="What is the capital of France?", max_output_tokens=8)
        return answer.usage.input_tokens, answer.usage.output_tokens, answer.output_text

    def responses_stream():
        done = None
        for event in client.responses.create(
            model=model, input="What is the capital of France?", max_output_tokens=8, stream=True
        ):
            if event.type == "response.completed":
                done = event.response
        return done.usage.input_tokens, done.usage.output_tokens, done.output_text

    claude = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=300)  # x-api-key
    claude_bearer = anthropic.Anthropic(base_url=base, auth_token=key, max_retries=0, timeout=300)  # Bearer

    def messages_call(sdk):
        def run():
            answer = sdk.messages.create(model=model, max_tokens=8, messages=messages)
            return answer.usage.input_tokens, answer.usage.output_tokens, answer.content[0].text

        return run

    def messages_stream():
        with claude.messages.stream(model=model, max_tokens=8, messages=messages) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        return final.usage.input_tokens, final.usage.output_tokens, text

    def count_tokens():
        counted = claude.messages.count_tokens(model=model, messages=messages)
        return counted.input_tokens, 0, ""

    record("chat", "chat", chat)
    record("chat_stream", "chat", chat_stream)
    record("responses", "responses", responses)
    record("responses_stream", "responses", responses_stream)
    record("messages_x_api_key", "messages", messages_call(claude))
    record("messages_bearer", "messages", messages_call(claude_bearer))
    record("messages_stream", "messages", messages_stream)
    record("count_tokens", "messages", count_tokens)
    return calls


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
