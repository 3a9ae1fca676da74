import { describe, expect, it } from "vitest"
import { compileJsonSchema } from "../../../src/executors/llm/structured/JsonGrammar.js"
import {
  AnswerShaper,
  anyCallSchema,
  parseToolCalls,
  type StreamedPiece,
  ToolCallStream,
  toolCallFormatOf
} from "../../../src/executors/llm/ToolCalls.js"
import { packagedTokenizerConfig } from "../../models/support/tokenizerModels.js"

const hermes =
  'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'

/** Feeds `text` in pieces of `size` characters and gathers what the stream says. */
const streamed = (stream: ToolCallStream, text: string, size: number): Array<StreamedPiece> => {
  const pieces: Array<StreamedPiece> = []
  for (let at = 0; at < text.length; at += size) pieces.push(...stream.push(text.slice(at, at + size)))
  pieces.push(...stream.end())
  return pieces
}

const merged = (pieces: ReadonlyArray<StreamedPiece>) => ({
  content: pieces.flatMap((piece) => ("content" in piece ? [piece.content] : [])).join(""),
  calls: pieces.flatMap((piece) => ("call" in piece ? [piece.call] : []))
})

describe("tool calls in a model's output", () => {
  it("reads the format from the chat template: Qwen's <tool_call>, Llama 3.1's JSON, none for a template without tools", async () => {
    expect(toolCallFormatOf(String((await packagedTokenizerConfig("qwen3")).chat_template))).toBe("hermes")
    expect(toolCallFormatOf(String((await packagedTokenizerConfig("llama3")).chat_template))).toBeUndefined()
    expect(
      toolCallFormatOf(
        '{%- if tools %}Respond in the format {"name": function name, "parameters": dictionary}<|python_tag|>{%- endif %}'
      )
    ).toBe("llama3-json")
    expect(toolCallFormatOf(undefined)).toBeUndefined()
  })

  it("parses Hermes calls after text, with arguments as JSON text", () => {
    expect(parseToolCalls(hermes, "hermes")).toEqual({
      content: "Let me check.\n",
      calls: [
        { name: "get_weather", arguments: '{"city":"Paris"}' },
        { name: "get_time", arguments: "{}" }
      ]
    })
    expect(parseToolCalls("no calls here", "hermes")).toEqual({ content: "no calls here", calls: [] })
    // A block that is not a call stays text.
    expect(parseToolCalls("<tool_call>oops</tool_call>", "hermes").calls).toEqual([])
    // Cut off by max_tokens after a whole call: the call still counts.
    expect(
      parseToolCalls('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call><tool_call>{"name": "b"', "hermes")
        .calls
    ).toEqual([{ name: "a", arguments: '{"x":1}' }])
  })

  it("parses Llama 3.1's JSON calls, with or without <|python_tag|>, several separated by ;", () => {
    expect(parseToolCalls('{"name": "get_weather", "parameters": {"city": "Paris"}}', "llama3-json")).toEqual({
      content: null,
      calls: [{ name: "get_weather", arguments: '{"city":"Paris"}' }]
    })
    expect(
      parseToolCalls(
        '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"k": true}}',
        "llama3-json"
      ).calls
    ).toEqual([
      { name: "a", arguments: "{}" },
      { name: "b", arguments: '{"k":true}' }
    ])
    expect(parseToolCalls("The sky is blue.", "llama3-json")).toEqual({ content: "The sky is blue.", calls: [] })
    expect(parseToolCalls("{not json", "llama3-json")).toEqual({ content: "{not json", calls: [] })
  })

  it("streams text at once, holds what may begin a call, and says a call when it is whole: equal to the whole parse", () => {
    for (const size of [1, 2, 5, 13, 1000]) {
      expect(merged(streamed(new ToolCallStream("hermes"), hermes, size))).toEqual({
        content: "Let me check.\n\n",
        calls: parseToolCalls(hermes, "hermes").calls
      })
      const llama = '{"name": "f", "parameters": {"a": [1, 2]}}'
      expect(merged(streamed(new ToolCallStream("llama3-json"), llama, size))).toEqual({
        content: "",
        calls: [{ name: "f", arguments: '{"a":[1,2]}' }]
      })
      expect(merged(streamed(new ToolCallStream("llama3-json"), "Hello <there>", size))).toEqual({
        content: "Hello <there>",
        calls: []
      })
    }
    // Text that only looks like the start of the tag goes out once it cannot be one.
    const stream = new ToolCallStream("hermes")
    expect(stream.push("a <tool")).toEqual([{ content: "a " }])
    expect(stream.push("box>")).toEqual([{ content: "<toolbox>" }])
  })

  it("shapes a named call's streamed arguments as OpenAI does: id and name first, then the arguments", () => {
    const shaper = new AnswerShaper({ kind: "named", name: "get_weather" })
    const [first] = shaper.start()
    expect(first).toMatchObject({
      toolCalls: [{ index: 0, type: "function", function: { name: "get_weather", arguments: "" } }]
    })
    expect(shaper.push('{"city"')).toEqual([{ toolCalls: [{ index: 0, function: { arguments: '{"city"' } }] }])
    expect(shaper.called).toBe(true)
    const whole = new AnswerShaper({ kind: "any" }).whole('{"name": "f", "arguments": {"x": 2}}')
    expect(whole).toMatchObject({ content: null, calls: [{ name: "f", arguments: '{"x":2}' }] })
  })

  it("moves each tool's definitions under the call schema's root, references and recursion with them", () => {
    const address = { type: "object", properties: { street: { type: "string" } }, required: ["street"] }
    const schema = anyCallSchema([
      {
        name: "a",
        parameters: {
          type: "object",
          properties: { home: { $ref: "#/$defs/Address" } },
          required: ["home"],
          $defs: { Address: address }
        }
      },
      {
        name: "b",
        parameters: {
          type: "object",
          properties: { child: { anyOf: [{ type: "null" }, { $ref: "#" }] }, old: { $ref: "#/definitions/Address" } },
          required: ["child", "old"],
          definitions: { Address: address }
        }
      }
    ])
    expect(schema.$defs).toMatchObject({
      "tool0.Address": address,
      tool0: { properties: { home: { $ref: "#/$defs/tool0.Address" } } },
      "tool1.Address": address,
      tool1: {
        properties: {
          child: { anyOf: [{ type: "null" }, { $ref: "#/$defs/tool1" }] },
          old: { $ref: "#/$defs/tool1.Address" }
        }
      }
    })
    expect(() => compileJsonSchema(schema, { strict: false })).not.toThrow()
  })
})
