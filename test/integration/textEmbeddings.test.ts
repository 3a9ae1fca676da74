import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoTokenizer } from "@huggingface/transformers"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { buildModel } from "../../src/models/ModelStore.js"
import { largestDifference, transformersEmbeddings } from "../models/support/EmbeddingFixtures.js"
import { offline } from "../models/support/TransformersJs.js"
import { invoke, removeStateDir, repoRoot, runCli, type RunningPlatform, startPlatform } from "../support/platform.js"

/**
 * examples/text_embed.ts on the real binary: registered with the CLI, called on the native route
 * and with OpenAI's client on `/app/text_embed/v1`; its vectors are transformers.js's
 * `feature-extraction` vectors of the built-in model, as numbers or base64, and what it cannot embed
 * is a 400 that says why.
 */

const texts = ["The weather is warm today.", "Is it warm outside?", "Search the document for a vector."]

interface EmbeddingAnswer {
  readonly object: string
  readonly data: ReadonlyArray<{ readonly object: string; readonly index: number; readonly embedding: unknown }>
  readonly model: string
  readonly usage: { readonly prompt_tokens: number; readonly total_tokens: number }
}

const fromBase64 = (base64: string): Float32Array => {
  const bytes = Buffer.from(base64, "base64")
  return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength))
}

describe("an embeddings app: examples/text_embed.ts", () => {
  let platform: RunningPlatform
  let modelDir: string
  let referenceDir: string
  let expected: Array<Float32Array>
  let ids: Array<Array<number>>

  const call = async (body: unknown) => {
    const response = await invoke(platform.url, "text_embed", JSON.stringify(body))
    return { status: response.status, body: (await response.json()) as Record<string, unknown> }
  }

  beforeAll(async () => {
    modelDir = await mkdtemp(join(tmpdir(), "cornserve-embed-models-"))
    platform = await startPlatform({ args: ["--devices", "cpu:0"], env: { CORNSERVE_MODEL_DIR: modelDir } })
    const registered = await runCli(["app", "register", join(repoRoot, "examples", "text_embed.ts")], {
      CORNSERVE_GATEWAY_URL: platform.url
    })
    expect(registered.stdout + registered.stderr).toContain("app text_embed is ready")
    // The same recipe built here: byte for byte the model the platform built.
    referenceDir = await buildModel("cornserve/tiny-text-embedder", join(modelDir, "reference"))
    expected = await transformersEmbeddings(referenceDir, texts, { pooling: "mean", normalize: true })
    const tokenizer = await AutoTokenizer.from_pretrained(offline(referenceDir))
    ids = texts.map((text) => Array.from(tokenizer(text).input_ids.data as BigInt64Array, Number))
  })

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await rm(modelDir, { recursive: true, force: true })
  })

  it("answers OpenAI's embedding list: transformers.js's vectors as numbers, with the tokens counted", async () => {
    const { status, body } = await call({ input: texts, model: "cornserve/tiny-text-embedder" })
    expect(status).toBe(200)
    const answer = body as unknown as EmbeddingAnswer
    const tokens = ids.reduce((sum, list) => sum + list.length, 0)
    expect(answer).toMatchObject({
      object: "list",
      model: "cornserve/tiny-text-embedder",
      usage: { prompt_tokens: tokens, total_tokens: tokens }
    })
    expect(answer.data.map((item) => [item.object, item.index])).toEqual([
      ["embedding", 0],
      ["embedding", 1],
      ["embedding", 2]
    ])
    const vectors = answer.data.map((item) => item.embedding as ReadonlyArray<number>)
    expect(largestDifference(vectors, expected)).toBeLessThan(1e-5)
    // The built-in model's vectors are near a bag of words: texts that share words are closer.
    const related = (
      await call({
        input: ["the cat sat on the green paper", "a green cat on paper", "ships cross the ocean at night"]
      })
    ).body as unknown as EmbeddingAnswer
    const [cat, greenCat, ships] = related.data.map((item) => item.embedding as ReadonlyArray<number>)
    const cosine = (a: ReadonlyArray<number>, b: ReadonlyArray<number>) =>
      a.reduce((sum, value, index) => sum + value * b[index]!, 0)
    expect(cosine(cat!, greenCat!)).toBeGreaterThan(cosine(cat!, ships!) + 0.2)
  })

  it("answers base64 (little-endian float32) that decodes to the same vectors, and takes one string or token ids", async () => {
    const encoded = (await call({ input: texts, encoding_format: "base64" })).body as unknown as EmbeddingAnswer
    const decoded = encoded.data.map((item) => fromBase64(item.embedding as string))
    expect(largestDifference(decoded, expected)).toBeLessThan(1e-5)
    const one = (await call({ input: texts[1] })).body as unknown as EmbeddingAnswer
    expect(one.data).toHaveLength(1)
    expect(largestDifference([one.data[0]!.embedding as ReadonlyArray<number>], [expected[1]!])).toBeLessThan(1e-5)
    const fromIds = (await call({ input: ids })).body as unknown as EmbeddingAnswer
    expect(
      largestDifference(
        fromIds.data.map((item) => item.embedding as ReadonlyArray<number>),
        expected
      )
    ).toBeLessThan(1e-5)
    const singleIds = (await call({ input: ids[2] })).body as unknown as EmbeddingAnswer
    expect(largestDifference([singleIds.data[0]!.embedding as ReadonlyArray<number>], [expected[2]!])).toBeLessThan(
      1e-5
    )
  })

  it("cuts vectors to a Matryoshka size the model lists, and refuses another", async () => {
    const cut = (await call({ input: texts[0], dimensions: 16 })).body as unknown as EmbeddingAnswer
    expect((cut.data[0]!.embedding as ReadonlyArray<number>).length).toBe(16)
    const refused = await call({ input: texts[0], dimensions: 20 })
    expect(refused.status).toBe(400)
    expect(JSON.stringify(refused.body)).toContain("matryoshka dimensions 64, 32, 16")
  })

  it("refuses with a 400 that names the problem: an empty input, too many, one longer than the model takes", async () => {
    for (const input of ["", [], ["fine", ""], Array.from({ length: 2049 }, () => "x")]) {
      const refused = await call({ input })
      expect(refused.status, JSON.stringify(input).slice(0, 40)).toBe(400)
      expect(refused.body).toMatchObject({ error: { code: "TaskInputRejected" } })
    }
    expect(JSON.stringify((await call({ input: ["fine", ""] })).body)).toContain("input.1: is empty")
    expect(JSON.stringify((await call({ input: Array.from({ length: 2049 }, () => "x") })).body)).toContain(
      "at most 2048"
    )
    const long = Array.from({ length: 200 }, (_, index) => `word${index}`).join(" ")
    const tooLong = await call({ input: long })
    expect(tooLong.status).toBe(400)
    expect(JSON.stringify(tooLong.body)).toMatch(/maximum context length is 128 tokens/)
    const truncated = await call({ input: long, truncate_prompt_tokens: -1 })
    expect(truncated.status).toBe(200)
    expect((truncated.body as unknown as EmbeddingAnswer).usage.prompt_tokens).toBe(128)
  })

  it("is one text-embedder task on Eric, whose profile records from synthetic sentences", async () => {
    const { tasks } = (await (await fetch(`${platform.url}/tasks/list`)).json()) as {
      tasks: ReadonlyArray<{ readonly id: string; readonly name: string; readonly usedBy: ReadonlyArray<string> }>
    }
    const task = tasks.find((row) => row.name === "text-embedder-tiny-text-embedder")
    expect(task?.usedBy).toEqual(["text_embed"])
    const recorded = await runCli(
      ["tasks", "profile", task!.id, "--record", "--levels", "1,2", "--seconds-per-level", "1", "--json"],
      { CORNSERVE_GATEWAY_URL: platform.url }
    )
    expect(recorded.code, recorded.stderr).toBe(0)
    const { curves } = JSON.parse(recorded.stdout) as {
      curves: ReadonlyArray<{ readonly points: ReadonlyArray<{ readonly calls: number }> }>
    }
    expect(curves[0]!.points.map((point) => point.calls > 0)).toEqual([true, true])
  })

  it("serves OpenAI's client at /app/text_embed/v1 (numbers and base64)", async () => {
    const client = new OpenAI({ baseURL: `${platform.url}/app/text_embed/v1`, apiKey: "unused" })
    // The client asks for base64 unless told otherwise, and decodes it itself.
    const answer = await client.embeddings.create({ model: "cornserve/tiny-text-embedder", input: texts })
    expect(
      largestDifference(
        answer.data.map((item) => item.embedding),
        expected
      )
    ).toBeLessThan(1e-5)
    const floats = await client.embeddings.create({
      model: "cornserve/tiny-text-embedder",
      input: texts[0]!,
      encoding_format: "float"
    })
    expect(largestDifference([floats.data[0]!.embedding], [expected[0]!])).toBeLessThan(1e-5)
    await expect(client.embeddings.create({ model: "cornserve/tiny-text-embedder", input: "" })).rejects.toMatchObject({
      status: 400
    })
  })
})
