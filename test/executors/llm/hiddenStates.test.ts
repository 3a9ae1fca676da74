import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ort from "onnxruntime-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { SamplingParams, TokenPartial } from "../../../src/executors/llm/protocol.js"
import { Runner } from "../../../src/executors/llm/Runner.js"
import type { EmbedOutput } from "../../../src/executors/llm/StepRunner.js"
import { llamaGraphs } from "../../../src/models/architectures/Llama.js"
import type { Dtype } from "../../../src/models/Dtype.js"
import { loadModelDirectory } from "../../../src/models/ModelDirectory.js"
import { Graph } from "../../../src/models/onnx/Graph.js"
import { randomLlamaFiles } from "../../../src/models/recipes/RandomLlama.js"
import { writeModelFiles } from "../../models/support/EmbeddingFixtures.js"
import { relativeError } from "../../models/support/Ort.js"
import { smallLlamaConfig } from "../../models/support/SmallLlama.js"

/**
 * A text-generation export's final hidden states (the LLM embedding task with source
 * "hidden_states"): the runner opens the community's decoder-only layout rewritten to give them
 * (HiddenStatesOutput.ts), and a prompt's hidden states equal, within 1e-5, those of the same
 * model exported without an lm_head (as embedding models are), run in-process; while other
 * requests decode beside them, too. The router sends them through the sidecar as it sends embed_tokens
 * (test/executors/llm/sidecar.test.ts).
 */

const config = smallLlamaConfig
const seed = 6
let root: string

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-hidden-states-"))
  await writeModelFiles(
    root,
    randomLlamaFiles({ config, layout: "decoder-only", dtypes: ["fp32", "q8"], seed, externalDataMinBytes: 4096 })
  )
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

const promptIds = Int32Array.from({ length: 11 }, (_, i) => (i * 53 + 7) % config.vocabSize)

/** The same model's embedding export (no lm_head: last_hidden_state), run in-process on the prompt (or `ids`). */
const reference = async (dtype: Dtype, ids: ArrayLike<number> = promptIds): Promise<Float32Array> => {
  const bytes = llamaGraphs(
    config,
    {
      layout: "decoder-only",
      dtype,
      positionIds: true,
      pastPrefix: "past_key_values",
      seed,
      std: 0.1,
      output: "last_hidden_state"
    },
    (name) => new Graph(name)
  )
    .get("model")!
    .toBytes()
  const session = await ort.InferenceSession.create(bytes, { intraOpNumThreads: 1 })
  const length = ids.length
  const feeds: Record<string, ort.Tensor> = {
    input_ids: new ort.Tensor("int64", BigInt64Array.from(Array.from(ids), BigInt), [1, length]),
    attention_mask: new ort.Tensor("int64", new BigInt64Array(length).fill(1n), [1, length]),
    position_ids: new ort.Tensor(
      "int64",
      BigInt64Array.from({ length }, (_, i) => BigInt(i)),
      [1, length]
    )
  }
  for (const name of session.inputNames.filter((input) => input.startsWith("past_key_values.")))
    feeds[name] = new ort.Tensor("float32", new Float32Array(0), [1, config.kvHeads, 0, config.headDim])
  const states = (await session.run(feeds)).last_hidden_state!
  await session.release()
  return states.data as Float32Array
}

const embed = (source: "hidden_states" | "embed_tokens") => ({
  id: `embed-${source}`,
  op: {
    op: "embed" as const,
    prompt: { inputIds: promptIds, media: [] },
    id: "x",
    source,
    receivers: [],
    inline: true
  }
})

const greedy: SamplingParams = { temperature: 0, topP: 1, seed: 0, maxNewTokens: 8, stopTokenIds: [] }

describe("a text-generation export's final hidden states", () => {
  it.each(["fp32", "q8"] as const)(
    "%s: a prompt's equal the embedding export's, alone and beside decoding requests",
    async (dtype) => {
      const runner = await Runner.open(await loadModelDirectory(root), "cpu", 1, dtype)
      try {
        const expected = await reference(dtype)
        const check = (output: EmbedOutput | undefined) => {
          if (output === undefined || !("embedding" in output))
            throw new Error(`no embedding: ${JSON.stringify(output)}`)
          expect(output.shape).toEqual([promptIds.length, config.hiddenSize])
          const error = relativeError(output.embedding, expected)
          expect(error, `relative error ${error}`).toBeLessThanOrEqual(1e-5)
        }
        const [alone] = await runner.step([embed("hidden_states")], () => undefined)
        check(alone)
        // Two requests prefilled, then the embedding while they decode.
        const generate = (id: string, ids: ReadonlyArray<number>) => ({
          id,
          op: { op: "prefill" as const, prompt: { inputIds: Int32Array.from(ids), media: [] }, sampling: greedy }
        })
        await runner.step([generate("a", [5, 9, 200, 31]), generate("b", [77, 3])], () => undefined)
        let decoded = 0
        const outputs = await runner.step(
          [{ id: "a", op: { op: "decode" } }, { id: "b", op: { op: "decode" } }, embed("hidden_states")],
          () => decoded++
        )
        expect(decoded).toBe(2)
        check(outputs.find((output) => output !== undefined && "embedding" in output))
      } finally {
        await runner.close()
      }
    }
  )

  // fp32: an 8-bit export quantises each run's activations with one scale, which spans a decode
  // step's rows there and the whole sequence in the reference.
  it.each(["fp32"] as const)(
    "%s: a generation that asks gets each step's input token's hidden state with its next token, as a run over the whole sequence gives",
    async (dtype) => {
      const runner = await Runner.open(await loadModelDirectory(root), "cpu", 1, dtype)
      try {
        const prefill = (id: string, ids: ArrayLike<number>, sampling: SamplingParams) => ({
          id,
          op: { op: "prefill" as const, prompt: { inputIds: Int32Array.from(ids), media: [] }, sampling }
        })
        const tokens: Array<number> = []
        const rows: Array<Float32Array> = []
        const take = (index: number, partial: TokenPartial) => {
          if (index !== 0) return expect(partial.hidden).toBeUndefined()
          tokens.push(partial.token)
          if (partial.hidden !== undefined) rows.push(partial.hidden)
        }
        // Beside another request that does not ask for them.
        await runner.step(
          [
            prefill("states", promptIds, { ...greedy, maxNewTokens: 6, hiddenStates: true }),
            prefill("other", [77, 3], greedy)
          ],
          take
        )
        while (tokens.length < 6)
          await runner.step(
            [
              { id: "states", op: { op: "decode" } },
              { id: "other", op: { op: "decode" } }
            ],
            take
          )
        // The first token comes from the prompt, and the last is never read: a row for each between.
        expect(tokens).toHaveLength(6)
        expect(rows).toHaveLength(5)
        const expected = await reference(dtype, [...promptIds, ...tokens])
        const width = config.hiddenSize
        rows.forEach((row, k) => {
          const at = (promptIds.length + k) * width
          const error = relativeError(row, expected.subarray(at, at + width))
          expect(error, `row ${k}: relative error ${error}`).toBeLessThanOrEqual(1e-5)
        })
      } finally {
        await runner.close()
      }
    }
  )

  it("refuses embed_tokens, which a decoder-only export has no graph for, naming the other source", async () => {
    const runner = await Runner.open(await loadModelDirectory(root), "cpu", 1, "fp32")
    try {
      const [refused] = await runner.step([embed("embed_tokens")], () => undefined)
      expect(refused).toEqual({ error: expect.stringMatching(/no embed_tokens.*"hidden_states"/) })
    } finally {
      await runner.close()
    }
  })
})
