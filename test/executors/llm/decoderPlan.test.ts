import { describe, expect, it } from "vitest"
import {
  addsScoreBiases,
  chooseDecoder,
  type DecoderFacts,
  type DecoderPlan,
  planDecoder
} from "../../../src/executors/llm/DecoderPlan.js"

/** An fp32 decoder on a CPU with nothing in the way of the shared cache. */
const plain: DecoderFacts = {
  quantizedRows: "apart",
  kvCache: "shared",
  quantisesPerTensor: false,
  slidingWindow: false,
  scoreBiases: false,
  device: "cpu:0"
}

const shared = { rewrite: true } as const
const notShared = (reason: RegExp) => ({ rewrite: false, reason: expect.stringMatching(reason) })

describe("planDecoder", () => {
  it.each<[string, Partial<DecoderFacts>, DecoderPlan]>([
    ["fp32 on a CPU", {}, { promptsApart: false, rowRewrite: false, sharedCache: shared }],
    [
      "the executor asks for copies",
      { kvCache: "copies" },
      { promptsApart: false, rowRewrite: false, sharedCache: notShared(/executor runs the cache as exported/) }
    ],
    [
      "a sliding window",
      { slidingWindow: true },
      { promptsApart: false, rowRewrite: false, sharedCache: notShared(/^the model attends within a sliding window$/) }
    ],
    [
      "ALiBi",
      { scoreBiases: true },
      { promptsApart: false, rowRewrite: false, sharedCache: notShared(/position biases \(ALiBi\)/) }
    ],
    [
      "CUDA",
      { device: "cuda:0" },
      { promptsApart: false, rowRewrite: false, sharedCache: notShared(/built for CPU devices/) }
    ],
    [
      "8-bit rows apart (the default)",
      { quantisesPerTensor: true },
      { promptsApart: true, rowRewrite: false, sharedCache: notShared(/each request runs apart/) }
    ],
    [
      "8-bit rows per row",
      { quantisesPerTensor: true, quantizedRows: "per-row" },
      { promptsApart: true, rowRewrite: true, sharedCache: shared }
    ],
    [
      "8-bit rows batched as exported",
      { quantisesPerTensor: true, quantizedRows: "as-exported" },
      { promptsApart: false, rowRewrite: false, sharedCache: notShared(/^the decoder runs as exported$/) }
    ],
    [
      "per-row asked of a decoder that does not quantise per tensor",
      { quantizedRows: "per-row" },
      { promptsApart: false, rowRewrite: false, sharedCache: shared }
    ],
    [
      "8-bit rows per row on CUDA: the rows rewrite, not the shared cache",
      { quantisesPerTensor: true, quantizedRows: "per-row", device: "cuda:0" },
      { promptsApart: true, rowRewrite: true, sharedCache: notShared(/built for CPU devices/) }
    ],
    [
      "copies win over every other reason",
      { kvCache: "copies", slidingWindow: true, scoreBiases: true, device: "cuda:1" },
      { promptsApart: false, rowRewrite: false, sharedCache: notShared(/executor runs the cache as exported/) }
    ]
  ])("%s", (_, facts, plan) => {
    expect(planDecoder({ ...plain, ...facts })).toEqual(plan)
  })
})

describe("chooseDecoder", () => {
  const perRow = planDecoder({ ...plain, quantisesPerTensor: true, quantizedRows: "per-row" })

  it("opens the shared rewrite where it matched", () => {
    expect(chooseDecoder(planDecoder(plain), { rows: false, shared: { matched: true }, sharedRows: false })).toEqual({
      decoder: "shared",
      rowsDecoder: undefined,
      promptsApart: false,
      rowsApart: false,
      kvCache: { mode: "shared" }
    })
  })

  it("runs as exported, giving the rewrite's reason, where the graph does not match", () => {
    const choice = chooseDecoder(planDecoder(plain), {
      rows: false,
      shared: { matched: false, reason: "layer 0's attention is not as exporters write it" },
      sharedRows: false
    })
    expect(choice.decoder).toBe("exported")
    expect(choice.kvCache).toEqual({ mode: "copies", reason: "layer 0's attention is not as exporters write it" })
  })

  it("gives the plan's reason where it tried no rewrite", () => {
    const choice = chooseDecoder(planDecoder({ ...plain, slidingWindow: true }), {
      rows: false,
      shared: undefined,
      sharedRows: false
    })
    expect(choice.kvCache).toEqual({ mode: "copies", reason: "the model attends within a sliding window" })
  })

  it("8-bit per row: both decoders on the shared cache, decode rows batched", () => {
    expect(chooseDecoder(perRow, { rows: true, shared: { matched: true }, sharedRows: true })).toEqual({
      decoder: "shared",
      rowsDecoder: "shared-rows",
      promptsApart: true,
      rowsApart: false,
      kvCache: { mode: "shared" }
    })
  })

  it("8-bit per row: where the rows rewrite does not take the shared cache, neither decoder does", () => {
    expect(chooseDecoder(perRow, { rows: true, shared: { matched: true }, sharedRows: false })).toEqual({
      decoder: "exported",
      rowsDecoder: "rows",
      promptsApart: true,
      rowsApart: false,
      kvCache: { mode: "copies", reason: "the per-row rewrite did not take the shared cache" }
    })
  })

  it("8-bit per row: where there was nothing to rewrite per row, each request runs apart", () => {
    expect(chooseDecoder(perRow, { rows: false, shared: { matched: true }, sharedRows: false })).toEqual({
      decoder: "shared",
      rowsDecoder: undefined,
      promptsApart: true,
      rowsApart: true,
      kvCache: { mode: "shared" }
    })
  })

  it("8-bit apart: every run alone on the export as it is", () => {
    const apart = planDecoder({ ...plain, quantisesPerTensor: true })
    const choice = chooseDecoder(apart, { rows: false, shared: undefined, sharedRows: false })
    expect(choice).toMatchObject({ decoder: "exported", rowsDecoder: undefined, promptsApart: true, rowsApart: true })
    expect(choice.kvCache.mode).toBe("copies")
  })
})

describe("addsScoreBiases", () => {
  it.each<[string, Record<string, unknown>, boolean]>([
    ["a Llama", { model_type: "llama" }, false],
    ["BLOOM", { model_type: "bloom" }, true],
    ["MPT by its type", { model_type: "mpt" }, true],
    ["MPT by its attention config", { model_type: "custom", attn_config: { alibi: true } }, true],
    ["an attention config without ALiBi", { model_type: "custom", attn_config: { alibi: false } }, false],
    ["Falcon's alibi variant", { model_type: "falcon", alibi: true }, true],
    ["a VLM whose text model has ALiBi", { model_type: "vlm", text_config: { model_type: "bloom" } }, true]
  ])("%s", (_, config, expected) => {
    expect(addsScoreBiases(config)).toBe(expected)
  })
})
