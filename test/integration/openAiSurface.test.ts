import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { AutoModelForCausalLM, AutoTokenizer, Tensor } from "@huggingface/transformers"
import { Ajv2020 } from "ajv/dist/2020.js"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { randomLlamaFiles } from "../../src/models/recipes/RandomLlama.js"
import { packagedTokenizerConfig } from "../models/support/tokenizerModels.js"
import { offline, transformersGreedy } from "../models/support/TransformersJs.js"
import { type RunningPlatform, runCli, startPlatform } from "../support/platform.js"

/**
 * OpenAI's API on an app, through the official `openai` client: models, completions (a text or
 * token ids, streamed or not), the chat parameters (n, logprobs, seed, penalties,
 * max_completion_tokens, stream_options), and the refusals OpenAI answers (an unknown model, a
 * parameter the platform does not implement).
 */

const config = {
  hiddenSize: 64,
  intermediateSize: 96,
  layers: 2,
  heads: 4,
  kvHeads: 2,
  headDim: 16,
  vocabSize: 512,
  maxPositions: 2048,
  ropeTheta: 10000,
  rmsNormEps: 1e-5
}

const appSource = (model: string) => `
import { ChatCompletionRequest, defineApp, LLMTask } from "cornserve/app"
const llm = new LLMTask({ model: ${JSON.stringify(model)} })
export default defineApp({
  tasks: { llm },
  request: ChatCompletionRequest,
  serve: (request) => llm.invoke(request)
})
`

const messages = [{ role: "user" as const, content: "What colour is the sky?" }]

describe("the OpenAI API on an app, through the official client", () => {
  let platform: RunningPlatform
  let root: string
  let llama: string
  let client: OpenAI

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-openai-"))
    llama = join(root, "models", "tiny-llama")
    // Qwen3's chat template, which takes tools and teaches the model <tool_call> blocks.
    const qwenTemplate = String((await packagedTokenizerConfig("qwen3")).chat_template)
    const extraFiles = new Map([["chat_template.jinja", new TextEncoder().encode(qwenTemplate)]])
    for (const [file, bytes] of randomLlamaFiles({ config, layout: "decoder-only", dtypes: ["fp32"], extraFiles })) {
      await mkdir(dirname(join(llama, file)), { recursive: true })
      await writeFile(join(llama, file), bytes)
    }
    platform = await startPlatform({ args: ["--devices", "cpu:0"], env: { CORNSERVE_MODEL_DIR: join(root, "models") } })
    const file = join(root, "chat.ts")
    await writeFile(file, appSource(llama))
    const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
    expect(registered.code, registered.stderr).toBe(0)
    client = new OpenAI({ baseURL: `${platform.url}/app/chat/v1`, apiKey: "unused", maxRetries: 0 })
  })

  afterAll(async () => {
    await platform?.stop()
    await rm(root, { recursive: true, force: true })
  })

  it("lists and retrieves the app's model; another model is a 404 model_not_found", async () => {
    const models = await client.models.list()
    expect(models.data.map((model) => model.id)).toEqual([llama])
    expect(models.data[0]!.object).toBe("model")
    expect((await client.models.retrieve(llama)).id).toBe(llama)

    const notFound = await client.models.retrieve("gpt-4o").catch((error: unknown) => error)
    expect(notFound).toBeInstanceOf(OpenAI.NotFoundError)
    expect((notFound as InstanceType<typeof OpenAI.NotFoundError>).code).toBe("model_not_found")

    const chat = await client.chat.completions
      .create({ model: "gpt-4o", messages, max_tokens: 4 })
      .catch((error: unknown) => error)
    expect(chat).toBeInstanceOf(OpenAI.NotFoundError)
    expect((chat as InstanceType<typeof OpenAI.NotFoundError>).code).toBe("model_not_found")
    expect((chat as Error).message).toContain(llama)
  })

  it("completes a prompt as it is, given as text or token ids, streamed or not: transformers.js's greedy tokens", async () => {
    const prompt = "Once upon a time"
    const tokenizer = await AutoTokenizer.from_pretrained(offline(llama))
    const promptIds = Array.from(tokenizer.encode(prompt))
    const [expectedIds] = await transformersGreedy(llama, "fp32", [promptIds], 10)
    const expected = tokenizer.decode(expectedIds!, { skip_special_tokens: true })

    const completion = await client.completions.create({ model: llama, prompt, max_tokens: 10, temperature: 0 })
    expect(completion.object).toBe("text_completion")
    expect(completion.choices[0]!.text).toBe(expected)
    expect(completion.usage!.prompt_tokens).toBe(promptIds.length)
    expect(completion.usage!.completion_tokens).toBe(expectedIds!.length)

    const fromIds = await client.completions.create({ model: llama, prompt: promptIds, max_tokens: 10, temperature: 0 })
    expect(fromIds.choices[0]!.text).toBe(expected)

    const stream = await client.completions.create({
      model: llama,
      prompt,
      max_tokens: 10,
      temperature: 0,
      stream: true
    })
    let streamed = ""
    let finish: string | null = null
    for await (const chunk of stream) {
      expect(chunk.object).toBe("text_completion")
      streamed += chunk.choices[0]?.text ?? ""
      finish = chunk.choices[0]?.finish_reason ?? finish
    }
    expect(streamed).toBe(expected)
    expect(finish).toBe(expectedIds!.length < 10 ? "stop" : "length")

    // OpenAI's default for completions is 16 tokens.
    const defaulted = await client.completions.create({ model: llama, prompt, temperature: 0, stop: null })
    expect(defaulted.usage!.completion_tokens).toBeLessThanOrEqual(16)
  })

  it("n: each choice its own draw, choice 0 the request's seed; streamed with their indices", async () => {
    const asked = { model: llama, messages, max_tokens: 8, temperature: 1, seed: 11 }
    const three = await client.chat.completions.create({ ...asked, n: 3 })
    expect(three.choices.map((choice) => choice.index)).toEqual([0, 1, 2])
    const alone = await client.chat.completions.create(asked)
    expect(three.choices[0]!.message.content).toBe(alone.choices[0]!.message.content)
    const again = await client.chat.completions.create({ ...asked, n: 3 })
    expect(again.choices.map((choice) => choice.message.content)).toEqual(
      three.choices.map((choice) => choice.message.content)
    )
    // Usage counts every choice's tokens, and the prompt once.
    expect(three.usage!.completion_tokens).toBeGreaterThan(alone.usage!.completion_tokens)
    expect(three.usage!.prompt_tokens).toBe(alone.usage!.prompt_tokens)

    const stream = await client.chat.completions.create({ ...asked, n: 3, stream: true })
    const texts = ["", "", ""]
    const finished = new Set<number>()
    for await (const chunk of stream) {
      for (const choice of chunk.choices) {
        texts[choice.index] += choice.delta.content ?? ""
        if (choice.finish_reason !== null) finished.add(choice.index)
      }
    }
    expect(texts).toEqual(three.choices.map((choice) => choice.message.content))
    expect([...finished].sort()).toEqual([0, 1, 2])

    const tooMany = await client.chat.completions.create({ ...asked, n: 9 }).catch((error: unknown) => error)
    expect(tooMany).toBeInstanceOf(OpenAI.APIError)
    expect((tooMany as InstanceType<typeof OpenAI.APIError>).status).toBe(422)
  })

  it("logprobs: each token's log probability under the model (transformers.js's logits) and its top alternatives", async () => {
    const completion = await client.chat.completions.create({
      model: llama,
      messages,
      max_tokens: 6,
      temperature: 0,
      logprobs: true,
      top_logprobs: 2
    })
    const content = completion.choices[0]!.logprobs!.content!
    expect(content.length).toBeGreaterThan(0)
    expect(content.map((token) => token.token).join("")).toBe(completion.choices[0]!.message.content)
    for (const token of content) {
      expect(token.logprob).toBeLessThanOrEqual(0)
      expect(token.top_logprobs).toHaveLength(2)
      // Greedy: the token drawn is the most likely one.
      expect(token.top_logprobs[0]!.logprob).toBeCloseTo(token.logprob, 6)
      expect(token.top_logprobs[1]!.logprob).toBeLessThanOrEqual(token.logprob)
      expect(token.bytes).toEqual(Array.from(Buffer.from(token.token, "utf8")))
    }

    // The first token's log probability is the log-softmax of transformers.js's last logits over the prompt.
    const tokenizer = await AutoTokenizer.from_pretrained(offline(llama))
    const { input_ids: promptIds } = tokenizer.apply_chat_template(messages, {
      add_generation_prompt: true,
      tokenize: true,
      return_tensor: false
    }) as unknown as { input_ids: Array<number> }
    const model = await AutoModelForCausalLM.from_pretrained(offline(llama), { dtype: "fp32" })
    try {
      const length = promptIds.length
      const { logits } = (await model({
        input_ids: new Tensor("int64", BigInt64Array.from(promptIds, BigInt), [1, length]),
        attention_mask: new Tensor("int64", new BigInt64Array(length).fill(1n), [1, length])
      })) as { logits: Tensor }
      const row = Array.from((logits.data as Float32Array).subarray((length - 1) * 512, length * 512))
      const max = Math.max(...row)
      const logZ = max + Math.log(row.reduce((sum, value) => sum + Math.exp(value - max), 0))
      const best = row.indexOf(max)
      expect(content[0]!.logprob).toBeCloseTo(row[best]! - logZ, 4)
    } finally {
      await model.dispose()
    }

    const streamed = await client.chat.completions.create({
      model: llama,
      messages,
      max_tokens: 6,
      temperature: 0,
      logprobs: true,
      stream: true
    })
    const tokens: Array<string> = []
    for await (const chunk of streamed)
      for (const token of chunk.choices[0]?.logprobs?.content ?? []) tokens.push(token.token)
    expect(tokens).toEqual(content.map((token) => token.token))

    const legacy = await client.completions.create({
      model: llama,
      prompt: "Once",
      max_tokens: 4,
      temperature: 0,
      logprobs: 2
    })
    const logprobs = legacy.choices[0]!.logprobs!
    expect(logprobs.tokens!.join("")).toBe(legacy.choices[0]!.text)
    expect(logprobs.token_logprobs).toHaveLength(logprobs.tokens!.length)
    expect(Object.keys(logprobs.top_logprobs![0]!).length).toBeGreaterThanOrEqual(1)
    expect(logprobs.text_offset![0]).toBe(0)

    const withoutLogprobs = await client.chat.completions
      .create({ model: llama, messages, max_tokens: 2, top_logprobs: 2 })
      .catch((error: unknown) => error)
    expect((withoutLogprobs as InstanceType<typeof OpenAI.APIError>).status).toBe(400)
  })

  it("seed, penalties, max_completion_tokens and stream_options", async () => {
    const asked = { model: llama, messages, max_completion_tokens: 7, temperature: 1.2, seed: 5 }
    const first = await client.chat.completions.create(asked)
    const second = await client.chat.completions.create(asked)
    expect(second.choices[0]!.message.content).toBe(first.choices[0]!.message.content)
    expect(first.usage!.completion_tokens).toBeLessThanOrEqual(7)

    // A frequency penalty this strong keeps greedy decoding off the tokens it already said.
    const plain = await client.chat.completions.create({
      model: llama,
      messages,
      max_tokens: 24,
      temperature: 0,
      logprobs: true
    })
    const penalized = await client.chat.completions.create({
      model: llama,
      messages,
      max_tokens: 24,
      temperature: 0,
      frequency_penalty: 2,
      presence_penalty: 2,
      logprobs: true
    })
    const repeats = (completion: OpenAI.ChatCompletion) => {
      const tokens = completion.choices[0]!.logprobs!.content!.map((token) => token.token)
      return tokens.length - new Set(tokens).size
    }
    expect(plain.choices[0]).toBeDefined()
    expect(repeats(penalized)).toBeLessThanOrEqual(repeats(plain))

    const stream = await client.chat.completions.create({
      model: llama,
      messages,
      max_tokens: 3,
      stream: true,
      stream_options: { include_usage: true }
    })
    const chunks: Array<OpenAI.ChatCompletionChunk> = []
    for await (const chunk of stream) chunks.push(chunk)
    const last = chunks[chunks.length - 1]!
    expect(last.choices).toEqual([])
    expect(last.usage!.completion_tokens).toBeGreaterThan(0)
  })

  it("refuses a parameter the platform does not implement, naming it, and one OpenAI does not have", async () => {
    const biased = await client.chat.completions
      .create({ model: llama, messages, max_tokens: 2, logit_bias: { "5": 100 } })
      .catch((error: unknown) => error)
    expect(biased).toBeInstanceOf(OpenAI.BadRequestError)
    expect((biased as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("logit_bias")
    expect((biased as Error).message).toContain("logit_bias")

    const unknown = await client.chat.completions
      .create({ model: llama, messages, max_tokens: 2, frobnicate: true } as never)
      .catch((error: unknown) => error)
    expect((unknown as InstanceType<typeof OpenAI.BadRequestError>).status).toBe(400)
    expect((unknown as Error).message).toContain("frobnicate")

    const suffix = await client.completions
      .create({ model: llama, prompt: "x", suffix: "y", max_tokens: 2 })
      .catch((error: unknown) => error)
    expect((suffix as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("suffix")
    const echo = await client.completions
      .create({ model: llama, prompt: "x", echo: true, max_tokens: 2 })
      .catch((error: unknown) => error)
    expect((echo as InstanceType<typeof OpenAI.BadRequestError>).status).toBe(400)
    expect((echo as Error).message).toContain("echo")
  })

  const weather = {
    type: "object",
    properties: {
      city: { type: "string" },
      unit: { type: "string", enum: ["celsius", "fahrenheit"] },
      days: { type: "integer" }
    },
    required: ["city", "unit", "days"],
    additionalProperties: false
  }
  const person = {
    type: "object",
    properties: {
      name: { type: "string" },
      age: { type: "integer" },
      tags: { type: "array", items: { type: "string" }, maxItems: 3 },
      address: {
        anyOf: [
          { type: "null" },
          {
            type: "object",
            properties: { street: { type: "string" }, zip: { type: "number" } },
            required: ["street", "zip"],
            additionalProperties: false
          }
        ]
      },
      verified: { type: "boolean" }
    },
    required: ["name", "age", "tags", "address", "verified"],
    additionalProperties: false
  }
  const tools = [
    {
      type: "function" as const,
      function: { name: "get_weather", description: "The weather in a city", parameters: weather }
    },
    { type: "function" as const, function: { name: "register_person", parameters: person } }
  ]
  const validator = (schema: object) => new Ajv2020({ strict: false }).compile(schema)

  it("json_schema: a random-weight model's answer parses and validates, sampled or greedy, streamed or not", async () => {
    const valid = validator(person)
    const format = { type: "json_schema" as const, json_schema: { name: "person", schema: person, strict: true } }
    for (let seed = 0; seed < 6; seed++) {
      const completion = await client.chat.completions.create({
        model: llama,
        messages,
        max_tokens: 96,
        temperature: seed === 0 ? 0 : 1,
        seed,
        response_format: format
      })
      const choice = completion.choices[0]!
      expect(choice.finish_reason).toBe("stop")
      const value: unknown = JSON.parse(choice.message.content!)
      expect(valid(value), JSON.stringify(valid.errors)).toBe(true)
    }
    const stream = await client.chat.completions.create({
      model: llama,
      messages,
      max_tokens: 96,
      temperature: 1,
      seed: 42,
      response_format: format,
      stream: true
    })
    let text = ""
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? ""
    expect(valid(JSON.parse(text)), text).toBe(true)

    const object = await client.chat.completions.create({
      model: llama,
      messages,
      max_tokens: 48,
      temperature: 1,
      seed: 3,
      response_format: { type: "json_object" }
    })
    const parsed: unknown = JSON.parse(object.choices[0]!.message.content!)
    expect(typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)).toBe(true)
  })

  it("json_schema under a budget too small for the value it began: closed in time, or says length", async () => {
    const valid = validator(person)
    for (const maxTokens of [24, 32, 40]) {
      const completion = await client.chat.completions.create({
        model: llama,
        messages,
        max_tokens: maxTokens,
        temperature: 1,
        seed: maxTokens,
        response_format: { type: "json_schema", json_schema: { name: "person", schema: person, strict: true } }
      })
      const choice = completion.choices[0]!
      if (choice.finish_reason === "stop") expect(valid(JSON.parse(choice.message.content!))).toBe(true)
      else expect(choice.finish_reason).toBe("length")
      expect(completion.usage!.completion_tokens).toBeLessThanOrEqual(maxTokens)
    }
  })

  it("a named tool choice: the arguments always validate against the function's parameters, streamed as OpenAI streams them", async () => {
    const valid = validator(weather)
    for (let seed = 0; seed < 4; seed++) {
      const completion = await client.chat.completions.create({
        model: llama,
        messages,
        max_tokens: 64,
        temperature: 1,
        seed,
        tools,
        tool_choice: { type: "function", function: { name: "get_weather" } }
      })
      const choice = completion.choices[0]!
      expect(choice.finish_reason).toBe("tool_calls")
      expect(choice.message.content).toBeNull()
      const call = choice.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall
      expect(call.type).toBe("function")
      expect(call.function.name).toBe("get_weather")
      expect(call.id).toMatch(/^call_/)
      expect(valid(JSON.parse(call.function.arguments)), call.function.arguments).toBe(true)
    }

    const stream = await client.chat.completions.create({
      model: llama,
      messages,
      max_tokens: 64,
      temperature: 1,
      seed: 9,
      tools,
      tool_choice: { type: "function", function: { name: "get_weather" } },
      stream: true
    })
    let name: string | undefined
    let args = ""
    let finish: string | null = null
    for await (const chunk of stream) {
      for (const call of chunk.choices[0]?.delta.tool_calls ?? []) {
        name ??= call.function?.name
        args += call.function?.arguments ?? ""
      }
      finish = chunk.choices[0]?.finish_reason ?? finish
    }
    expect(name).toBe("get_weather")
    expect(valid(JSON.parse(args)), args).toBe(true)
    expect(finish).toBe("tool_calls")
  })

  it("tool_choice required: one call of one of the tools, its arguments valid for that tool", async () => {
    for (let seed = 0; seed < 4; seed++) {
      const completion = await client.chat.completions.create({
        model: llama,
        messages,
        max_tokens: 96,
        temperature: 1,
        seed,
        tools,
        tool_choice: "required"
      })
      const call = completion.choices[0]!.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall
      const tool = tools.find((candidate) => candidate.function.name === call.function.name)
      expect(tool, call.function.name).toBeDefined()
      const valid = validator(tool!.function.parameters)
      expect(valid(JSON.parse(call.function.arguments)), call.function.arguments).toBe(true)
    }
  })

  it("renders the tools through the model's chat template, and refuses what it cannot hold to", async () => {
    const plain = await client.chat.completions.create({ model: llama, messages, max_tokens: 2 })
    const withTools = await client.chat.completions.create({ model: llama, messages, max_tokens: 2, tools })
    expect(withTools.usage!.prompt_tokens).toBeGreaterThan(plain.usage!.prompt_tokens + 20)

    const unknownTool = await client.chat.completions
      .create({ model: llama, messages, tools, tool_choice: { type: "function", function: { name: "nope" } } })
      .catch((error: unknown) => error)
    expect((unknownTool as InstanceType<typeof OpenAI.APIError>).status).toBe(400)
    expect((unknownTool as Error).message).toContain("nope")

    const patterned = await client.chat.completions
      .create({
        model: llama,
        messages,
        response_format: {
          type: "json_schema",
          json_schema: {
            name: "x",
            schema: {
              type: "object",
              properties: { a: { type: "string", pattern: "^a+$" } },
              required: ["a"],
              additionalProperties: false
            }
          }
        }
      })
      .catch((error: unknown) => error)
    expect((patterned as InstanceType<typeof OpenAI.APIError>).status).toBe(400)
    expect((patterned as Error).message).toContain("pattern")
  })
})
