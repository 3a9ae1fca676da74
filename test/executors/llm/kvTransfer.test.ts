import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { ChatCompletion, KvPrefillResponse, LlmStats } from "../../../src/executors/llm/api.js"
import { randomLlamaFiles } from "../../../src/models/recipes/RandomLlama.js"
import { SidecarClient } from "../../../src/sidecar/SidecarClient.js"
import { Tensor } from "../../../src/sidecar/Tensor.js"
import { packagedTokenizerConfig } from "../../models/support/tokenizerModels.js"
import { writeModelFiles } from "../../models/support/EmbeddingFixtures.js"
import { smallLlamaConfig } from "../../models/support/SmallLlama.js"
import { startExecutor, startSidecar } from "../../support/executors.js"
import { authorized, postAuthorized, secretEnv } from "../executorSecret.js"

/**
 * Prefill and decode apart, between two LLM executors of one model on one node, as real processes:
 * the prefill executor runs a chat's prompt and sends its KV cache through the sidecar; the decode
 * executor, named the cache in a chat completion (`cornserve_kv`), prefills only the rest of the
 * prompt from it and answers the greedy text of an executor that ran it all.
 */

type Executor = Awaited<ReturnType<typeof startExecutor>>
let root: string
let model: string
let sidecar: Awaited<ReturnType<typeof startSidecar>>
let client: SidecarClient
/** The prefill executor, and the decode executor that takes its caches. */
let prefill: Executor
let decode: Executor
const post = postAuthorized

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-kv-transfer-"))
  model = join(root, "small-llama")
  // Qwen3's chat template, which renders a chat's tools into its prompt.
  const qwenTemplate = String((await packagedTokenizerConfig("qwen3")).chat_template)
  const extraFiles = new Map([["chat_template.jinja", new TextEncoder().encode(qwenTemplate)]])
  await writeModelFiles(
    model,
    // Room for a prompt with tools.
    randomLlamaFiles({
      config: { ...smallLlamaConfig, maxPositions: 1024 },
      layout: "decoder-only",
      dtypes: ["fp32"],
      seed: 9,
      extraFiles
    })
  )
  const env = { CORNSERVE_MODEL_DIR: root, ...secretEnv }
  sidecar = await startSidecar("kv-node", env)
  const common = ["--kind", "llm", "--model", model, "--devices", "cpu:0", "--sidecar-socket", sidecar.socket]
  ;[prefill, decode] = await Promise.all([
    startExecutor([...common, "--embedding-wait-ms", "500"], env),
    startExecutor([...common, "--embedding-wait-ms", "500"], env)
  ])
  client = await SidecarClient.connect(sidecar.socket)
})

afterAll(async () => {
  await client?.close()
  await Promise.all([prefill?.stop(), decode?.stop()])
  await sidecar?.stop()
  await rm(root, { recursive: true, force: true })
})

const messages = [
  {
    role: "user",
    content:
      "the red fox and the blue bird went to the green hill where the yellow sun shone on the white snow and the black cat slept by the grey stone"
  }
]
const greedy = () => ({ model, messages, max_tokens: 8, temperature: 0 })

describe("a chat's KV cache from a prefill executor to a decode executor", () => {
  it("decodes from the cache sent: the same greedy text, only the prompt's last token run", async () => {
    const sent = await post<KvPrefillResponse>(`${prefill.url}/v1/cornserve/kv-prefill`, {
      model,
      messages,
      id: "kv-fox"
    })
    expect(sent.status, JSON.stringify(sent.body)).toBe(200)
    const { shape, prompt_tokens } = sent.body
    const positions = shape[2]
    expect(shape).toEqual([2 * smallLlamaConfig.layers, smallLlamaConfig.kvHeads, positions, smallLlamaConfig.headDim])
    expect(sent.body.dtype).toBe("float32")
    expect(positions).toBe(prompt_tokens - 1)
    const decoded = await post<ChatCompletion>(`${decode.url}/v1/chat/completions`, {
      ...greedy(),
      cornserve_kv: { id: "kv-fox" }
    })
    expect(decoded.status, JSON.stringify(decoded.body)).toBe(200)
    const whole = await post<ChatCompletion>(`${prefill.url}/v1/chat/completions`, greedy())
    expect(decoded.body.choices[0]!.message.content).toBe(whole.body.choices[0]!.message.content)
    expect(decoded.body.usage).toEqual(whole.body.usage)
    const stats = (await (await fetch(`${decode.url}/v1/cornserve/stats`, { headers: authorized })).json()) as LlmStats
    expect(stats.kvImports).toEqual({ requests: 1, tokens: positions })
    // It stays out of the decode executor's prefix cache, and out of the sidecar once taken.
    expect(stats.prefixCache).toMatchObject({ blocks: 0 })
    await expect(client.recv("kv-fox", 0, { timeoutMs: 50 })).rejects.toThrow()
    expect(sent.body.cached_tokens).toBe(0)

    // The same chat again (its next turn starts with it): the prefill executor runs only what
    // follows the blocks its prefix cache kept, and the decode executor answers alike.
    const again = await post<KvPrefillResponse>(`${prefill.url}/v1/cornserve/kv-prefill`, {
      model,
      messages,
      id: "kv-fox-again"
    })
    expect(again.status, JSON.stringify(again.body)).toBe(200)
    expect(again.body.shape).toEqual(shape)
    expect(again.body.cached_tokens).toBeGreaterThanOrEqual(16)
    const redecoded = await post<ChatCompletion>(`${decode.url}/v1/chat/completions`, {
      ...greedy(),
      cornserve_kv: { id: "kv-fox-again" }
    })
    expect(redecoded.body.choices[0]!.message.content).toBe(whole.body.choices[0]!.message.content)
  })

  it("404 for a cache that never arrives, 400 for a tensor that is not one; the executor then decodes as before", async () => {
    const missing = await post<{ error: { message: string } }>(`${decode.url}/v1/chat/completions`, {
      ...greedy(),
      cornserve_kv: { id: "kv-never" }
    })
    expect(missing.status).toBe(404)
    expect(missing.body.error.message).toMatch(/did not arrive/)
    await client.send("kv-wrong", new Tensor("float32", [2, 2], Float32Array.of(1, 2, 3, 4)), { to: [sidecar.nodeId] })
    const wrong = await post<{ error: { message: string } }>(`${decode.url}/v1/chat/completions`, {
      ...greedy(),
      cornserve_kv: { id: "kv-wrong" }
    })
    expect(wrong.status).toBe(400)
    expect(wrong.body.error.message).toMatch(/not a KV cache/)
    // A cache a chunk a cache tensor, then its token ids (the prompt's first 16, taken from a cache
    // sent for it), with another number of heads: refused by the workers.
    const source = await post<KvPrefillResponse>(`${prefill.url}/v1/cornserve/kv-prefill`, {
      model,
      messages,
      id: "kv-geometry-source"
    })
    const sentIds = await client.recv("kv-geometry-source", source.body.shape[0])
    const first16 = Int32Array.from(((sentIds as Tensor).data as Int32Array).subarray(0, 16))
    await client.markDone("kv-geometry-source")
    for (let chunk = 0; chunk < 4; chunk++)
      await client.send("kv-geometry", new Tensor("float32", [3, 16, 24], new Float32Array(3 * 16 * 24)), {
        to: [sidecar.nodeId],
        chunk,
        numChunks: 5
      })
    await client.send("kv-geometry", new Tensor("int32", [16], first16), {
      to: [sidecar.nodeId],
      chunk: 4,
      numChunks: 5
    })
    const geometry = await post<{ error: { message: string } }>(`${decode.url}/v1/chat/completions`, {
      ...greedy(),
      cornserve_kv: { id: "kv-geometry" }
    })
    expect(geometry.status).toBe(400)
    expect(geometry.body.error.message).toMatch(/this model's is/)
    const plain = await post<ChatCompletion>(`${decode.url}/v1/chat/completions`, greedy())
    expect(plain.status).toBe(200)
    // Nothing of the refused caches is left in the sidecar: each was freed once read.
    for (const id of ["kv-wrong", "kv-geometry"])
      await expect(client.recv(id, 0, { timeoutMs: 50 })).rejects.toThrow(/within|timed out|RecvTimeout/i)
  })

  it("takes the cache of a short prompt too: all of it but its last token", async () => {
    const short = [{ role: "user", content: "hi" }]
    const sent = await post<KvPrefillResponse>(`${prefill.url}/v1/cornserve/kv-prefill`, {
      model,
      messages: short,
      id: "kv-short"
    })
    expect(sent.status, JSON.stringify(sent.body)).toBe(200)
    expect(sent.body.shape[2]).toBe(sent.body.prompt_tokens - 1)
    const request = { model, messages: short, max_tokens: 8, temperature: 0 }
    const whole = await post<ChatCompletion>(`${prefill.url}/v1/chat/completions`, request)
    const decoded = await post<ChatCompletion>(`${decode.url}/v1/chat/completions`, {
      ...request,
      cornserve_kv: { id: "kv-short" }
    })
    expect(decoded.status, JSON.stringify(decoded.body)).toBe(200)
    expect(decoded.body.choices[0]!.message.content).toBe(whole.body.choices[0]!.message.content)
    await expect(client.recv("kv-short", 0, { timeoutMs: 50 })).rejects.toThrow()
  })

  it("prefills the prompt whole when the cache sent is another prompt's, and answers as without it", async () => {
    const sent = await post<KvPrefillResponse>(`${prefill.url}/v1/cornserve/kv-prefill`, {
      model,
      messages,
      id: "kv-other"
    })
    expect(sent.status).toBe(200)
    const before = (await (await fetch(`${decode.url}/v1/cornserve/stats`, { headers: authorized })).json()) as LlmStats
    const other = [{ role: "user", content: `${messages[0]!.content}, and then it rained` }]
    const request = { model, messages: other, max_tokens: 8, temperature: 0 }
    const decoded = await post<ChatCompletion>(`${decode.url}/v1/chat/completions`, {
      ...request,
      cornserve_kv: { id: "kv-other" }
    })
    expect(decoded.status, JSON.stringify(decoded.body)).toBe(200)
    const whole = await post<ChatCompletion>(`${prefill.url}/v1/chat/completions`, request)
    expect(decoded.body.choices[0]!.message.content).toBe(whole.body.choices[0]!.message.content)
    // And a longer prompt's cache for a shorter prompt: as much left aside, not refused.
    const longer = await post<KvPrefillResponse>(`${prefill.url}/v1/cornserve/kv-prefill`, {
      model,
      messages: other,
      id: "kv-longer"
    })
    expect(longer.status).toBe(200)
    const shorter = await post<ChatCompletion>(`${decode.url}/v1/chat/completions`, {
      ...greedy(),
      cornserve_kv: { id: "kv-longer" }
    })
    expect(shorter.status, JSON.stringify(shorter.body)).toBe(200)
    const shorterWhole = await post<ChatCompletion>(`${prefill.url}/v1/chat/completions`, greedy())
    expect(shorter.body.choices[0]!.message.content).toBe(shorterWhole.body.choices[0]!.message.content)
    const after = (await (await fetch(`${decode.url}/v1/cornserve/stats`, { headers: authorized })).json()) as LlmStats
    expect(after.kvImports).toEqual(before.kvImports)
    await expect(client.recv("kv-other", 0, { timeoutMs: 50 })).rejects.toThrow()
    await expect(client.recv("kv-longer", 0, { timeoutMs: 50 })).rejects.toThrow()
  })

  it("takes the cache of a chat with tools, which both executors render into the prompt", async () => {
    const tools = [
      {
        type: "function",
        function: { name: "weather", description: "The weather in a city", parameters: { type: "object" } }
      }
    ]
    const sent = await post<KvPrefillResponse>(`${prefill.url}/v1/cornserve/kv-prefill`, {
      model,
      messages,
      tools,
      id: "kv-tools"
    })
    expect(sent.status, JSON.stringify(sent.body)).toBe(200)
    const before = (await (await fetch(`${decode.url}/v1/cornserve/stats`, { headers: authorized })).json()) as LlmStats
    const request = { model, messages, tools, tool_choice: "none", max_tokens: 8, temperature: 0 }
    const decoded = await post<ChatCompletion>(`${decode.url}/v1/chat/completions`, {
      ...request,
      cornserve_kv: { id: "kv-tools" }
    })
    expect(decoded.status, JSON.stringify(decoded.body)).toBe(200)
    const whole = await post<ChatCompletion>(`${prefill.url}/v1/chat/completions`, request)
    expect(decoded.body.choices[0]!.message.content).toBe(whole.body.choices[0]!.message.content)
    const after = (await (await fetch(`${decode.url}/v1/cornserve/stats`, { headers: authorized })).json()) as LlmStats
    expect(after.kvImports!.requests).toBe((before.kvImports?.requests ?? 0) + 1)
    expect(after.kvImports!.tokens).toBe((before.kvImports?.tokens ?? 0) + sent.body.prompt_tokens - 1)
  })

  it("400 for a prompt over the model's context, as a chat completion's", async () => {
    const long = [{ role: "user", content: "the red fox ran. ".repeat(400) }]
    const refused = await post<{ error: { code: string; message: string } }>(`${prefill.url}/v1/cornserve/kv-prefill`, {
      model,
      messages: long,
      id: "kv-long"
    })
    expect(refused.status).toBe(400)
    expect(refused.body.error.message).toMatch(/maximum context length is 1024 tokens/)
    const plain = await post<ChatCompletion>(`${prefill.url}/v1/chat/completions`, greedy())
    expect(plain.status).toBe(200)
  })

  it("400 for embeddings to send on that do not match the prompt's", async () => {
    const mismatched = await post<{ error: { message: string } }>(`${prefill.url}/v1/cornserve/kv-prefill`, {
      model,
      messages,
      id: "kv-forward",
      forward_embeddings: ["emb-on"]
    })
    expect(mismatched.status).toBe(400)
    expect(mismatched.body.error.message).toMatch(/forward_embeddings names 1 ids for 0 cornserve_embeddings/)
  })
})
