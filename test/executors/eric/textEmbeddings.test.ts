import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoTokenizer } from "@huggingface/transformers"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { maxTextEmbeddingInputs } from "../../../src/executors/eric/api.js"
import { textEmbeddingPlan } from "../../../src/executors/eric/TextEmbeddings.js"
import { BadRequest } from "../../../src/executors/common/errors.js"
import { buildModel } from "../../../src/models/ModelStore.js"
import type { TextEmbeddingSpec } from "../../../src/models/TextEmbedding.js"
import { startExecutor } from "../../support/executors.js"
import {
  largestDifference,
  qwen3EmbedderFiles,
  transformersEmbeddings,
  writeModelFiles
} from "../../models/support/EmbeddingFixtures.js"
import { offline } from "../../models/support/TransformersJs.js"
import { authorized, secretEnv } from "../executorSecret.js"

/**
 * Eric's `POST /text-embeddings` as the dispatcher calls it: the built-in BERT sentence encoder
 * and a decoder exported for feature extraction, whose vectors equal transformers.js's
 * `feature-extraction` for texts alone, many in one request, and requests sent at once; token ids
 * taken as they are; inputs the model cannot take refused with a 400 that names them.
 */

const texts = [
  "The weather is warm today.",
  "Is it warm outside?",
  "Search the document for a vector: a longer sentence, with words the vocabulary lacks.",
  "a",
  "naïve café",
  "Every good boy does fine."
]

interface Answer {
  readonly embeddings: ReadonlyArray<string>
  readonly promptTokens: number
}

const vectorOf = (base64: string): Float32Array => {
  const bytes = Buffer.from(base64, "base64")
  return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength))
}

const norm = (vector: Float32Array) => Math.sqrt(vector.reduce((sum, value) => sum + value * value, 0))

describe("Eric: text embeddings", () => {
  let root: string
  let env: Record<string, string>
  let bertDir: string
  let decoderDir: string
  let bert: Awaited<ReturnType<typeof startExecutor>>
  let decoder: Awaited<ReturnType<typeof startExecutor>>
  let bertExpected: Array<Float32Array>
  let bertIds: Array<Array<number>>

  const embed = (executor: { readonly url: string }, body: unknown) =>
    fetch(`${executor.url}/text-embeddings`, {
      method: "POST",
      headers: { ...authorized, "content-type": "application/json" },
      body: JSON.stringify(body)
    })

  const vectors = async (executor: { readonly url: string }, body: unknown) => {
    const response = await embed(executor, body)
    expect(response.status, await response.clone().text()).toBe(200)
    const answer = (await response.json()) as Answer
    return { vectors: answer.embeddings.map(vectorOf), promptTokens: answer.promptTokens }
  }

  const refusal = async (executor: { readonly url: string }, body: unknown) => {
    const response = await embed(executor, body)
    return {
      status: response.status,
      error: ((await response.json()) as { error: { code: string; message: string } }).error
    }
  }

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-text-embeddings-"))
    env = { CORNSERVE_MODEL_DIR: join(root, "models"), ...secretEnv }
    bertDir = await buildModel("cornserve/tiny-text-embedder", env.CORNSERVE_MODEL_DIR)
    decoderDir = await writeModelFiles(
      join(root, "models", "fixtures", "qwen3-embedder"),
      await qwen3EmbedderFiles(["fp32"])
    )
    bertExpected = await transformersEmbeddings(bertDir, texts, { pooling: "mean", normalize: true })
    const tokenizer = await AutoTokenizer.from_pretrained(offline(bertDir))
    bertIds = texts.map((text) => Array.from(tokenizer(text).input_ids.data as BigInt64Array, Number))
    const common = ["--kind", "eric", "--max-batch-size", "32", "--max-batch-delay-ms", "0"]
    bert = await startExecutor([...common, "--model", "cornserve/tiny-text-embedder"], env)
    decoder = await startExecutor([...common, "--model", decoderDir], env)
  })

  afterAll(async () => {
    await bert?.stop()
    await decoder?.stop()
    await rm(root, { recursive: true, force: true })
  })

  it("reports the text model it serves: its limit, pooling and Matryoshka sizes", async () => {
    const info = (await (await fetch(`${bert.url}/info`, { headers: authorized })).json()) as Record<string, unknown>
    expect(info).toMatchObject({
      kind: "eric",
      modalities: ["text"],
      text: {
        maxTokens: 128,
        hiddenSize: 64,
        pooling: "mean",
        normalize: true,
        poolingSource: "1_Pooling/config.json",
        matryoshka: [64, 32, 16]
      }
    })
  })

  it("BERT: transformers.js's vectors for a text alone and for texts of different lengths in one request", async () => {
    const alone = await vectors(bert, { inputs: [texts[0]] })
    expect(largestDifference(alone.vectors, [bertExpected[0]!])).toBeLessThan(1e-5)
    expect(alone.promptTokens).toBe(bertIds[0]!.length)
    const together = await vectors(bert, { inputs: texts })
    expect(largestDifference(together.vectors, bertExpected)).toBeLessThan(1e-5)
    expect(together.promptTokens).toBe(bertIds.reduce((sum, ids) => sum + ids.length, 0))
    for (const vector of together.vectors) expect(norm(vector)).toBeCloseTo(1, 5)
  })

  it("BERT: requests sent at once, batched by the engine, each get their own vectors", async () => {
    const answers = await Promise.all(
      [...texts, ...texts].map((text) => vectors(bert, { inputs: [text] }).then((answer) => answer.vectors[0]!))
    )
    expect(largestDifference(answers, [...bertExpected, ...bertExpected])).toBeLessThan(1e-5)
  })

  it("takes token ids as they are: the ids of a text give the text's vector", async () => {
    const answer = await vectors(bert, { inputs: bertIds })
    expect(largestDifference(answer.vectors, bertExpected)).toBeLessThan(1e-5)
  })

  it("a decoder (Qwen3-Embedding's layout): transformers.js's last-token vectors, alone and together", async () => {
    const expected = await transformersEmbeddings(decoderDir, texts, { pooling: "last_token", normalize: true })
    const alone = await Promise.all(texts.map((text) => vectors(decoder, { inputs: [text] })))
    expect(
      largestDifference(
        alone.map((answer) => answer.vectors[0]!),
        expected
      )
    ).toBeLessThan(1e-5)
    const together = await vectors(decoder, { inputs: texts })
    expect(largestDifference(together.vectors, expected)).toBeLessThan(1e-5)
  })

  it("refuses a text longer than the model takes (400, as vLLM), and cuts it when truncation is asked", async () => {
    const long = Array.from({ length: 200 }, (_, index) => `word${index}`).join(" ")
    const refused = await refusal(bert, { inputs: ["short", long] })
    expect(refused.status).toBe(400)
    expect(refused.error.code).toBe("ContextLengthExceeded")
    expect(refused.error.message).toMatch(/maximum context length is 128 tokens, but input 1 has \d+/)
    const tokenizer = await AutoTokenizer.from_pretrained(offline(bertDir))
    const ids = Array.from(tokenizer(long).input_ids.data as BigInt64Array, Number)
    // The first 126 tokens of the text between [CLS] and [SEP]: sentence-transformers' truncation.
    const kept = [...ids.slice(0, 127), ids.at(-1)!]
    const [truncated] = (await vectors(bert, { inputs: [long], truncate: -1 })).vectors
    const [fromIds] = (await vectors(bert, { inputs: [kept] })).vectors
    expect(largestDifference([truncated!], [fromIds!])).toBeLessThan(1e-6)
    const cut = await vectors(bert, { inputs: [long], truncate: 10 })
    expect(cut.promptTokens).toBe(10)
    expect((await refusal(bert, { inputs: [long], truncate: 129 })).status).toBe(400)
  })

  it("refuses what cannot be embedded with a 400 naming it: an empty input, too many, an id outside the vocabulary", async () => {
    expect(await refusal(bert, { inputs: ["fine", ""] })).toMatchObject({
      status: 400,
      error: { code: "BadRequest", message: "input 1 is empty" }
    })
    expect(await refusal(bert, { inputs: [[101, 102], []] })).toMatchObject({ status: 400 })
    expect(await refusal(bert, { inputs: [] })).toMatchObject({ status: 400 })
    const tooMany = await refusal(bert, { inputs: Array.from({ length: maxTextEmbeddingInputs + 1 }, () => "x") })
    expect(tooMany.status).toBe(400)
    expect(tooMany.error.message).toContain("2048")
    expect(await refusal(bert, { inputs: [[101, 99999, 102]] })).toMatchObject({
      status: 400,
      error: { message: expect.stringContaining("token id 99999, outside the model's vocabulary") }
    })
  })

  it("cuts vectors to the Matryoshka sizes a model lists, normalized again; refuses other sizes", async () => {
    const [full] = (await vectors(bert, { inputs: [texts[2]] })).vectors
    const [cut] = (await vectors(bert, { inputs: [texts[2]], dimensions: 32 })).vectors
    expect(cut!.length).toBe(32)
    expect(norm(cut!)).toBeCloseTo(1, 5)
    const scale = norm(full!.slice(0, 32))
    expect(largestDifference([cut!], [full!.slice(0, 32).map((value) => value / scale)])).toBeLessThan(1e-6)
    const refused = await refusal(bert, { inputs: ["x"], dimensions: 20 })
    expect(refused).toMatchObject({ status: 400, error: { code: "BadRequest" } })
    expect(refused.error.message).toContain("matryoshka dimensions 64, 32, 16")
    // config.json's is_matryoshka: any size up to the hidden size.
    const [any] = (await vectors(decoder, { inputs: ["x"], dimensions: 20 })).vectors
    expect(any!.length).toBe(20)
  })
})

describe("a text-embedding request against what the model says", () => {
  const spec: TextEmbeddingSpec = {
    hiddenSize: 64,
    vocabSize: 1000,
    maxTokens: 128,
    pooling: undefined,
    normalize: undefined,
    poolingSource: "the model has no modules.json",
    matryoshka: undefined
  }

  it("needs the pooling from the model's files or the task, and normalizes by default", () => {
    const unknown = textEmbeddingPlan({ inputs: ["x"] }, spec, "m")
    expect(unknown).toBeInstanceOf(BadRequest)
    expect((unknown as BadRequest).message).toContain(
      "model m does not say how to pool its token embeddings (the model has no modules.json)"
    )
    expect(textEmbeddingPlan({ inputs: ["x"], pooling: "cls" }, spec, "m")).toEqual({
      pooling: "cls",
      normalize: true,
      truncateTo: undefined,
      dimensions: undefined
    })
    expect(
      textEmbeddingPlan({ inputs: ["x"], truncate: -1 }, { ...spec, pooling: "mean", normalize: false }, "m")
    ).toEqual({
      pooling: "mean",
      normalize: false,
      truncateTo: 128,
      dimensions: undefined
    })
  })

  it("refuses dimensions for a model that is not Matryoshka, as vLLM does", () => {
    const refused = textEmbeddingPlan({ inputs: ["x"], pooling: "mean", dimensions: 32 }, spec, "m")
    expect((refused as BadRequest).message).toBe(
      "model m does not support matryoshka representation: its vectors cannot be cut to dimensions"
    )
    const tooWide = textEmbeddingPlan(
      { inputs: ["x"], pooling: "mean", dimensions: 65 },
      { ...spec, matryoshka: "any" },
      "m"
    )
    expect((tooWide as BadRequest).message).toContain("dimensions must be 1 to 64")
  })
})
