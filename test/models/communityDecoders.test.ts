import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import onnxProto from "onnx-proto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { SamplingParams } from "../../src/executors/llm/protocol.js"
import type { QuantizedRows } from "../../src/executors/llm/DecoderPlan.js"
import type { DecoderOptions } from "../../src/executors/llm/DecoderSessions.js"
import { Runner } from "../../src/executors/llm/Runner.js"
import type { StepItem, StepRunner } from "../../src/executors/llm/StepRunner.js"
import { decoderFiles, decoderInterface, type GraphValue } from "../../src/models/DecoderLayout.js"
import { type Dtype, dtypes } from "../../src/models/Dtype.js"
import { loadModelDirectory } from "../../src/models/ModelDirectory.js"
import { int8ActivationsLevel, withMatMulNBitsAccuracy } from "../../src/models/onnx/MatMulNBitsAccuracy.js"
import { Random } from "../../src/models/Random.js"
import { type RandomLlamaOptions, randomLlamaFiles } from "../../src/models/recipes/RandomLlama.js"
import { aloneAndBatched, drive } from "../support/driveRunner.js"
import { smallLlamaConfig } from "./support/SmallLlama.js"
import { transformersGreedy } from "./support/TransformersJs.js"

/**
 * Text LLMs in the layouts and precisions the community exports them in, run by the LLM
 * executor's Runner and by transformers.js: the same greedy tokens, whether a request runs alone
 * or batched with others that join later.
 */

const config = smallLlamaConfig

const maxNewTokens = 10
const random = new Random(3)
const prompts = [7, 19, 3].map((length) => Array.from({ length }, () => random.below(config.vocabSize)))

const greedy: SamplingParams = { temperature: 0, topP: 1, seed: 0, maxNewTokens, stopTokenIds: [] }

let root: string

const writeModel = async (name: string, options: Omit<RandomLlamaOptions, "config">): Promise<string> => {
  const dir = join(root, name)
  for (const [file, bytes] of randomLlamaFiles({ config, ...options })) {
    await mkdir(dirname(join(dir, file)), { recursive: true })
    await writeFile(join(dir, file), bytes)
  }
  return dir
}

/** Our tokens for each prompt: alone, and batched (the third joins two steps after the first two). */
const runnerTokens = async (dir: string, dtype?: Dtype, options: DecoderOptions = {}) => {
  const runner = await Runner.open(await loadModelDirectory(dir), "cpu:0", 1, dtype, options)
  try {
    return {
      ...(await aloneAndBatched(runner, prompts, greedy)),
      files: runner.files,
      rowsApart: runner.rowsApart,
      promptsApart: runner.promptsApart,
      kvCache: runner.kvCache
    }
  } finally {
    await runner.close()
  }
}

let decoderOnly: string

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-community-"))
  decoderOnly = await writeModel("decoder-only", { layout: "decoder-only", dtypes })
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

/**
 * The 8-bit exports quantise activations on the fly (DynamicQuantizeLinear), with one scale over
 * the whole input: batched with neighbours, a request's greedy tokens would change with them (they
 * did on some CPUs). The runner runs such a decoder's requests apart, so batched answers equal
 * the answers alone for every dtype.
 */
const batchDependent: ReadonlyArray<Dtype> = ["q8", "int8", "uint8"]

describe("the decoder-only layout (onnx/model*.onnx)", () => {
  it.each(dtypes)("%s: the same greedy tokens as transformers.js, alone and batched", async (dtype) => {
    const expected = await transformersGreedy(decoderOnly, dtype, prompts, maxNewTokens)
    const ours = await runnerTokens(decoderOnly, dtype)
    expect(ours.files.layout).toBe("decoder-only")
    expect(
      ours.files.decoder.endsWith(
        dtype === "fp32" ? "onnx/model.onnx" : `_${dtype === "q8" ? "quantized" : dtype}.onnx`
      )
    ).toBe(true)
    expect(ours.alone).toEqual(expected)
    expect(ours.batched).toEqual(expected)
    expect(ours.promptsApart).toBe(batchDependent.includes(dtype))
    expect(ours.rowsApart).toBe(batchDependent.includes(dtype))
    // The shared cache (the attention rewritten to read it in place) for every dtype but the
    // 8-bit ones, whose requests run apart on the export as it is.
    expect(ours.kvCache.mode).toBe(batchDependent.includes(dtype) ? "copies" : "shared")
    if (batchDependent.includes(dtype)) {
      // With per-row scales, decode steps batch, and (on this model) the tokens are the same.
      const perRow = await runnerTokens(decoderOnly, dtype, { quantizedRows: "per-row" })
      expect(perRow.rowsApart).toBe(false)
      expect(perRow.kvCache.mode).toBe("shared")
      expect(perRow.alone).toEqual(expected)
      expect(perRow.batched).toEqual(expected)
    }
    // Not a degenerate model: different prompts continue differently.
    expect(new Set(expected.map((tokens) => tokens.join(","))).size).toBe(prompts.length)
  })

  it("q8 with external data: per-row scales rewrite the graph alone, and decode steps batch", async () => {
    const dir = await writeModel("external-data-q8", {
      layout: "decoder-only",
      dtypes: ["q8"],
      externalDataMinBytes: 4096,
      extraConfig: { "transformers.js_config": { use_external_data_format: { "model_quantized.onnx": 1 } } }
    })
    const expected = await transformersGreedy(dir, "q8", prompts, maxNewTokens)
    const perRow = await runnerTokens(dir, "q8", { quantizedRows: "per-row" })
    expect(perRow.rowsApart).toBe(false)
    expect(perRow.kvCache.mode).toBe("shared")
    expect(perRow.alone).toEqual(expected)
    expect(perRow.batched).toEqual(expected)
  })

  it("q4 with int8 activations: every MatMulNBits computes in int8, and a request's tokens do not depend on its batch", async () => {
    const graph = onnxProto.onnx.ModelProto.decode(await readFile(join(decoderOnly, "onnx", "model_q4.onnx"))).graph!
    const set = onnxProto.onnx.ModelProto.decode(
      withMatMulNBitsAccuracy(onnxProto.onnx.ModelProto.encode({ graph }).finish(), int8ActivationsLevel).bytes
    ).graph!
    const levels = set
      .node!.filter((node) => node.opType === "MatMulNBits")
      .map((node) => node.attribute!.find((attribute) => attribute.name === "accuracy_level")?.i)
    expect(levels.length).toBe(config.layers * 7 + 1)
    expect(levels.every((level) => Number(level) === int8ActivationsLevel)).toBe(true)

    const ours = await runnerTokens(decoderOnly, "q4", { q4Activations: "int8" })
    expect(ours.kvCache.mode).toBe("shared")
    expect(ours.batched).toEqual(ours.alone)
    expect(ours.alone.every((tokens) => tokens.length === maxNewTokens)).toBe(true)
  })

  it("q8: a request's log probabilities do not depend on its batch neighbours (they would, batched as exported)", async () => {
    const withLogprobs: SamplingParams = { ...greedy, logprobs: 0 }
    /** Each prompt's log probabilities: alone, then all together (the third joining two steps later). */
    const logprobs = async (quantizedRows: QuantizedRows) => {
      const runner = await Runner.open(await loadModelDirectory(decoderOnly), "cpu:0", 1, "q8", { quantizedRows })
      const run = async (
        scripted: ReadonlyArray<{ readonly id: string; readonly prompt: number; readonly joinAt: number }>
      ) => {
        const seen = new Map(scripted.map((request) => [request.id, [] as Array<number>]))
        const running = new Set<string>()
        for (let step = 0; step === 0 || running.size > 0 || scripted.some((r) => r.joinAt >= step); step++) {
          const items: Array<StepItem> = [...running].map((id) => ({ id, op: { op: "decode" } }))
          for (const request of scripted.filter((r) => r.joinAt === step)) {
            const prompt = { inputIds: Int32Array.from(prompts[request.prompt]!), media: [] }
            items.push({ id: request.id, op: { op: "prefill", prompt, sampling: withLogprobs } })
            running.add(request.id)
          }
          await runner.step(items, (index, partial) => {
            seen.get(items[index]!.id)!.push(partial.logprob!)
            if (partial.finish !== undefined) running.delete(items[index]!.id)
          })
        }
        return seen
      }
      try {
        const alone = []
        for (const prompt of [0, 1, 2]) alone.push((await run([{ id: "alone", prompt, joinAt: 0 }])).get("alone")!)
        const together = await run(
          [0, 1, 2].map((prompt) => ({ id: `r${prompt}`, prompt, joinAt: prompt === 2 ? 2 : 0 }))
        )
        return { alone, together: [0, 1, 2].map((prompt) => together.get(`r${prompt}`)!) }
      } finally {
        await runner.close()
      }
    }
    const largestDifference = (a: ReadonlyArray<ReadonlyArray<number>>, b: ReadonlyArray<ReadonlyArray<number>>) =>
      Math.max(...a.flatMap((row, i) => row.map((value, j) => Math.abs(value - b[i]![j]!))))
    // Rewritten to a scale per row, on the shared cache (each row's attention over its own
    // positions, no padding): batched, a request's numbers are its numbers alone, bit for bit.
    const perRow = await logprobs("per-row")
    expect(perRow.together).toEqual(perRow.alone)
    // Run apart, on the export as it is: bit for bit; the same numbers as per row but for float
    // rounding (its attention sums over the concatenated cache in another order).
    const apart = await logprobs("apart")
    expect(apart.together).toEqual(apart.alone)
    expect(largestDifference(perRow.alone, apart.alone)).toBeLessThan(1e-5)
    // As exported, one activation scale spans the batch: the same requests answer otherwise.
    const batched = await logprobs("as-exported")
    expect(batched.alone).toEqual(apart.alone)
    expect(largestDifference(batched.together, batched.alone)).toBeGreaterThan(1e-4)
  })

  it("a graph without position_ids derives them from the mask, as transformers.js expects", async () => {
    const dir = await writeModel("no-position-ids", { layout: "decoder-only", dtypes: ["fp32"], positionIds: false })
    const ours = await runnerTokens(dir)
    expect(ours.alone).toEqual(await transformersGreedy(dir, "fp32", prompts, maxNewTokens))
    expect(ours.batched).toEqual(ours.alone)
  })

  it.each(["fp32", "q4"] as const)("%s: weights in an external data file (model*.onnx_data) load", async (dtype) => {
    const file = dtype === "fp32" ? "model.onnx" : "model_q4.onnx"
    const dir = await writeModel(`external-data-${dtype}`, {
      layout: "decoder-only",
      dtypes: [dtype],
      externalDataMinBytes: 4096,
      extraConfig: { "transformers.js_config": { use_external_data_format: { [file]: 1 } } }
    })
    const ours = await runnerTokens(dir, dtype)
    // Rewritten onto the shared cache too: the rewritten graph finds its weights beside the file.
    expect(ours.kvCache.mode).toBe("shared")
    expect(ours.alone).toEqual(await transformersGreedy(dir, dtype, prompts, maxNewTokens))
    expect(ours.batched).toEqual(ours.alone)
  })

  it.each(["fp32", "fp16"] as const)(
    "%s: attention as torch exports scaled_dot_product_attention is rewritten onto the shared cache, and answers as transformers.js does",
    async (dtype) => {
      const dir = await writeModel(`sdpa-${dtype}`, { layout: "decoder-only", dtypes: [dtype], attention: "sdpa" })
      const ours = await runnerTokens(dir, dtype)
      expect(ours.kvCache.mode).toBe("shared")
      const expected = await transformersGreedy(dir, dtype, prompts, maxNewTokens)
      expect(ours.alone).toEqual(expected)
      expect(ours.batched).toEqual(expected)
      // The same weights as the grouped form: the same model.
      expect(expected).toEqual(await transformersGreedy(decoderOnly, dtype, prompts, maxNewTokens))
    }
  )

  it("runs as exported where the shared cache does not apply, saying why, and when asked to", async () => {
    // A sliding window is the exports' mask's to apply, which the rewrite drops.
    const dir = await writeModel("sliding-window", {
      layout: "decoder-only",
      dtypes: ["fp32"],
      extraConfig: { sliding_window: 16, use_sliding_window: true }
    })
    const windowed = await runnerTokens(dir)
    expect(windowed.kvCache).toEqual({ mode: "copies", reason: "the model attends within a sliding window" })
    const shared = await runnerTokens(decoderOnly, "fp32")
    expect(windowed.alone).toEqual(shared.alone)
    // ALiBi's biases are added where the mask is, which the rewrite drops with it.
    const alibi = await writeModel("alibi", { layout: "decoder-only", dtypes: ["fp32"], extraConfig: { alibi: true } })
    expect((await runnerTokens(alibi)).kvCache.reason).toMatch(/ALiBi/)
    const runner = await Runner.open(await loadModelDirectory(decoderOnly), "cpu:0", 1, "fp32", { kvCache: "copies" })
    expect(runner.kvCache.mode).toBe("copies")
    await runner.close()
  })

  it("a cache named past.N.key / present.N.key runs as past_key_values.N.key does", async () => {
    const dir = await writeModel("past-naming", { layout: "decoder-only", dtypes: ["fp32"], pastPrefix: "past" })
    const reference = await runnerTokens(decoderOnly, "fp32")
    const ours = await runnerTokens(dir)
    expect(ours.alone).toEqual(reference.alone)
    expect(ours.batched).toEqual(reference.alone)
  })
})

describe("the split layout (embed_tokens + decoder_model_merged)", () => {
  it.each(["fp32", "fp16"] as const)(
    "%s: the same model as the decoder-only export of the same weights",
    async (dtype) => {
      const dir = await writeModel(`split-${dtype}`, { layout: "split", dtypes: [dtype] })
      const ours = await runnerTokens(dir)
      expect(ours.files).toMatchObject({ layout: "split", dtype })
      expect(ours.alone).toEqual(await transformersGreedy(decoderOnly, dtype, prompts, maxNewTokens))
      expect(ours.batched).toEqual(ours.alone)
    }
  )
})

/**
 * Prompts prefilled in pieces: from blocks the prefix cache holds, and a chunk per step while
 * others decode. Two prompts share a 40-token system prompt; blocks are 8 tokens and chunks 5, so
 * a hit starts mid-prompt and every piece boundary falls elsewhere.
 */
describe("prefill in pieces: the prefix cache and chunked prefill", () => {
  const system = Array.from({ length: 40 }, () => random.below(config.vocabSize))
  const turns = [9, 13, 4].map((length) => [...system, ...Array.from({ length }, () => random.below(config.vocabSize))])
  const request = (id: string, turn: number, joinAt: number) => ({
    id,
    prompt: { inputIds: Int32Array.from(turns[turn]!), media: [] },
    sampling: greedy,
    joinAt
  })

  it.each(["fp32", "fp16", "q8"] as const)(
    "%s: the same greedy tokens as transformers.js, cold, from cached blocks, in chunks beside neighbours",
    async (dtype) => {
      const expected = await transformersGreedy(decoderOnly, dtype, turns, maxNewTokens)
      const runner = await Runner.open(await loadModelDirectory(decoderOnly), "cpu:0", 1, dtype, {
        prefixBlockTokens: 8,
        chunkTokens: 5
      })
      try {
        const cold = await drive(runner, [request("cold", 0, 0)])
        expect(cold.get("cold")).toEqual(expected[0])
        // The other turns find the system prompt's 5 blocks.
        const hits = await drive(runner, [request("hit1", 1, 0), request("hit2", 2, 0)])
        expect([hits.get("hit1"), hits.get("hit2")]).toEqual([expected[1], expected[2]])
        // Joining while others decode: the new prompt's uncached part goes 5 tokens a step.
        const mixed = await drive(runner, [request("a", 0, 0), request("b", 1, 3), request("c", 2, 4)])
        expect(["a", "b", "c"].map((id) => mixed.get(id))).toEqual(expected)
        if (dtype === "q8") {
          // Per-tensor activation scales: a piece's would differ from the whole prompt's, so neither is used.
          expect(runner.prefixCache).toBeUndefined()
          return
        }
        // Every turn after the first found the 40 shared tokens; a and b found their whole turns
        // but for the last block's worth (48 of 49 and of 53 tokens): hit1, hit2, a, b, c.
        expect(runner.prefixCache!.stats).toMatchObject({ lookups: 6, hits: 5, hitTokens: 40 + 40 + 48 + 48 + 40 })
        // The next turn of a chat: the first prompt, its answer, and more. Finished requests left
        // their answers' blocks too (the last token is never run): 49 + 9 positions, 7 blocks.
        const next = [...turns[0]!, ...expected[0]!, 11, 12, 13, 14, 15]
        const [nextExpected] = await transformersGreedy(decoderOnly, dtype, [next], maxNewTokens)
        const before = runner.prefixCache!.stats.hitTokens
        const followUp = await drive(runner, [
          { ...request("next", 0, 0), prompt: { inputIds: Int32Array.from(next), media: [] } }
        ])
        expect(followUp.get("next")).toEqual(nextExpected)
        expect(runner.prefixCache!.stats.hitTokens - before).toBe(56)
      } finally {
        await runner.close()
      }
    }
  )

  it("fp32: with no cache, a long prompt joins 3 tokens a step while another decodes, with the same tokens", async () => {
    const expected = await transformersGreedy(decoderOnly, "fp32", turns, maxNewTokens)
    const runner = await Runner.open(await loadModelDirectory(decoderOnly), "cpu:0", 1, "fp32", {
      prefixCacheBytes: 0,
      chunkTokens: 3
    })
    /** Which requests got a token, step by step. */
    const steps: Array<Array<string>> = []
    const recording: StepRunner = {
      held: [],
      step: async (items, emit) => {
        const got: Array<string> = []
        const outputs = await runner.step(items, (index, partial) => {
          got.push(items[index]!.id)
          emit(index, partial)
        })
        steps.push(got)
        return outputs
      },
      close: () => runner.close()
    }
    try {
      expect(runner.prefixCache).toBeUndefined()
      // a decodes for longer than b's prompt takes to join.
      const tokens = await drive(recording, [
        { ...request("a", 0, 0), sampling: { ...greedy, maxNewTokens: 30 } },
        { ...request("b", 1, 2), sampling: { ...greedy, maxNewTokens: 2 } }
      ])
      expect(tokens.get("a")!.slice(0, maxNewTokens)).toEqual(expected[0])
      expect(tokens.get("b")).toEqual(expected[1]!.slice(0, 2))
      // b's 53 tokens take 18 steps of 3; a gets its token in every one of them.
      const first = steps.findIndex((got) => got.includes("b"))
      expect(first).toBe(2 + Math.ceil(53 / 3) - 1)
      expect(steps.slice(2, first + 1).every((got) => got.includes("a"))).toBe(true)
    } finally {
      await runner.close()
    }
  })

  it("the cache stays within its bound under a flood of distinct prompts", async () => {
    const runner = await Runner.open(await loadModelDirectory(decoderOnly), "cpu:0", 1, "fp32", {
      prefixBlockTokens: 8,
      // Kept small: 2 layers × key and value × 2 heads × 8 positions × 24 × 4 bytes = 6 KiB a block.
      prefixCacheBytes: 6 * 6144
    })
    try {
      for (let i = 0; i < 12; i++) {
        const ids = Array.from({ length: 33 }, () => random.below(config.vocabSize))
        await drive(runner, [
          {
            id: `flood${i}`,
            prompt: { inputIds: Int32Array.from(ids), media: [] },
            sampling: { ...greedy, maxNewTokens: 1 },
            joinAt: 0
          }
        ])
        expect(runner.prefixCache!.stats.bytes).toBeLessThanOrEqual(6 * 6144)
      }
      expect(runner.prefixCache!.stats).toMatchObject({ blocks: 6, hits: 0, evictions: 12 * 4 - 6 })
    } finally {
      await runner.close()
    }
  })
})

describe("choosing the files", () => {
  it("fp32 by default, else the dtype that loses the least precision; a missing dtype lists those there", async () => {
    const all = await loadModelDirectory(decoderOnly)
    expect(decoderFiles(all).dtype).toBe("fp32")
    expect(decoderFiles(all, "q4").decoder).toBe(join(decoderOnly, "onnx", "model_q4.onnx"))
    const dir = await writeModel("quantized-only", { layout: "decoder-only", dtypes: ["q4", "fp16", "bnb4"] })
    const some = await loadModelDirectory(dir)
    expect(decoderFiles(some).dtype).toBe("fp16")
    expect(() => decoderFiles(some, "q8")).toThrow(
      /has no q8 export \(model_quantized\.onnx\); the dtypes it has: fp16, q4, bnb4/
    )
  })

  it("a directory with no decoder names the layouts it supports", async () => {
    const dir = await writeModel("encoder-only", { layout: "decoder-only", dtypes: ["fp32"] })
    const model = await loadModelDirectory(dir)
    const renamed = { ...model, onnx: new Map([["vision_encoder", join(dir, "onnx", "model.onnx")]]) }
    expect(() => decoderFiles(renamed)).toThrow(/not an LLM in a supported layout: it needs the decoder-only layout/)
    const half = { ...model, onnx: new Map([["embed_tokens", join(dir, "onnx", "model.onnx")]]) }
    expect(() => decoderFiles(half)).toThrow(/split layout but has no onnx\/decoder_model_merged\.onnx/)
  })
})

describe("reading a decoder's graph", () => {
  const cache = (layer: number, kind: string, name = `past_key_values.${layer}.${kind}`): GraphValue => ({
    name,
    type: "float32",
    shape: ["batch_size", 2, "past_sequence_length", 24]
  })
  const inputs: ReadonlyArray<GraphValue> = [
    { name: "input_ids", type: "int64", shape: ["batch_size", "sequence_length"] },
    { name: "attention_mask", type: "int64", shape: ["batch_size", "total_sequence_length"] },
    cache(0, "key"),
    cache(0, "value")
  ]
  const outputs: ReadonlyArray<GraphValue> = [
    { name: "logits", type: "float32", shape: ["batch_size", "sequence_length", 512] },
    { name: "present.0.key", type: "float32", shape: [] },
    { name: "present.0.value", type: "float32", shape: [] }
  ]
  const expected = { layers: 1, kvHeads: 2, headDim: 24 }
  const read = (i: ReadonlyArray<GraphValue>, o: ReadonlyArray<GraphValue> = outputs, e = expected) =>
    decoderInterface(i, o, e, "onnx/model.onnx", "/models/m")

  it("reads what it takes", () => {
    expect(read(inputs)).toMatchObject({
      tokens: "input_ids",
      positionIds: false,
      cacheType: "float32",
      cache: [
        { input: "past_key_values.0.key", output: "present.0.key" },
        { input: "past_key_values.0.value", output: "present.0.value" }
      ]
    })
  })

  it("refuses what it cannot fill, naming the file and the input", () => {
    expect(() => read([...inputs, { name: "token_type_ids", type: "int64", shape: [] }])).toThrow(
      /onnx\/model\.onnx: its input token_type_ids is not one the platform knows how to fill/
    )
    expect(() => read(inputs.filter((value) => value.name !== "attention_mask"))).toThrow(/no attention_mask input/)
    expect(() => read(inputs.filter((value) => value.name !== "input_ids"))).toThrow(
      /takes neither input_ids nor inputs_embeds/
    )
    expect(() => read(inputs, outputs.slice(1))).toThrow(/no logits output/)
    expect(() => read(inputs, outputs.slice(0, 2))).toThrow(/no output present\.0\.value/)
    expect(() => read(inputs, outputs, { ...expected, layers: 2 })).toThrow(
      /takes 2 cache inputs, but config\.json describes 2 layers/
    )
    expect(() => read(inputs, outputs, { ...expected, kvHeads: 3 })).toThrow(/config\.json gives 3 key-value heads/)
    expect(() => read([inputs[0]!, inputs[1]!, { ...cache(0, "key"), type: "int8" }, cache(0, "value")])).toThrow(
      /past_key_values\.0\.key is int8, not float32 or float16/
    )
  })
})
