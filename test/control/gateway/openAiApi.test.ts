import { describe, expect, it } from "vitest"
import { matchOpenAiRoute, modelsAnswer, prepareOpenAiRequest } from "../../../src/control/gateway/OpenAiApi.js"

const messages = [{ role: "user", content: "hi" }]

describe("OpenAI routes on an app", () => {
  it("matches chat, completions, embeddings and models by method and path", () => {
    expect(matchOpenAiRoute("POST", "/app/a/v1/chat/completions")).toEqual({ appId: "a", route: "chat" })
    expect(matchOpenAiRoute("POST", "/app/a/v1/completions")).toEqual({ appId: "a", route: "completions" })
    expect(matchOpenAiRoute("POST", "/app/a/v1/embeddings")).toEqual({ appId: "a", route: "embeddings" })
    expect(matchOpenAiRoute("GET", "/app/a/v1/models")).toEqual({ appId: "a", route: "models", model: undefined })
    expect(matchOpenAiRoute("GET", "/app/a/v1/models/m%2Fx")).toEqual({ appId: "a", route: "models", model: "m%2Fx" })
    expect(matchOpenAiRoute("GET", "/app/a/v1/chat/completions")).toBeUndefined()
    expect(matchOpenAiRoute("POST", "/app/a/v1/models")).toBeUndefined()
    expect(matchOpenAiRoute("POST", "/app/a/v1/completions/x")).toBeUndefined()
  })

  it("refuses another model as OpenAI does, and answers the app's", () => {
    const refused = prepareOpenAiRequest("chat", JSON.stringify({ messages, model: "gpt-4o" }), ["org/m"])
    expect(refused).toMatchObject({ refusal: { status: 404, code: "model_not_found", param: "model" } })
    expect(prepareOpenAiRequest("chat", JSON.stringify({ messages, model: "org/m" }), ["org/m"])).toHaveProperty("body")
    expect(modelsAnswer(["org/m"], 5, "org%2Fm")).toEqual({
      json: JSON.stringify({ id: "org/m", object: "model", created: 5, owned_by: "cornserve" })
    })
    expect(modelsAnswer(["org/m"], 5, "other")).toMatchObject({ refusal: { code: "model_not_found" } })
  })

  it("names a parameter the platform does not implement, or one that does not exist", () => {
    const bias = prepareOpenAiRequest("chat", JSON.stringify({ messages, logit_bias: {} }), [])
    expect(bias).toMatchObject({ refusal: { status: 400, param: "logit_bias", code: "unsupported_parameter" } })
    const odd = prepareOpenAiRequest("chat", JSON.stringify({ messages, odd: 1 }), [])
    expect(odd).toMatchObject({ refusal: { status: 400, param: "odd" } })
    expect((odd as { refusal: { message: string } }).refusal.message).toContain("not a parameter of chat completions")
  })

  it("hands a completions request to the app as a chat request with the prompt as it is", () => {
    const prepared = prepareOpenAiRequest("completions", JSON.stringify({ prompt: [1, 2, 3], logprobs: 2 }), [])
    expect(prepared).toHaveProperty("stream", false)
    const chat = JSON.parse((prepared as { body: string }).body)
    expect(chat).toMatchObject({
      cornserve_prompt: [1, 2, 3],
      max_tokens: 16,
      logprobs: true,
      top_logprobs: 2,
      stream_options: { include_usage: true }
    })
    expect(chat.messages).toHaveLength(1)
    const text = prepareOpenAiRequest("completions", JSON.stringify({ prompt: ["Once"], stream: true }), [])
    expect(JSON.parse((text as { body: string }).body)).toMatchObject({ cornserve_prompt: "Once", stream: true })
    const batch = prepareOpenAiRequest("completions", JSON.stringify({ prompt: ["a", "b"] }), [])
    expect(batch).toMatchObject({ refusal: { status: 400 } })
  })

  it("asks a chat request that does not stream for usage, and passes a body that is not JSON to the app", () => {
    const prepared = prepareOpenAiRequest("chat", JSON.stringify({ messages }), [])
    expect(JSON.parse((prepared as { body: string }).body).stream_options).toEqual({ include_usage: true })
    expect(prepareOpenAiRequest("chat", "{not json", [])).toEqual({ stream: false, body: "{not json", fields: {} })
  })
})
