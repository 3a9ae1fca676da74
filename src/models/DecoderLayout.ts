import { type Dtype, dtypePreference, dtypes, onnxFileName, parseOnnxFileName } from "./Dtype.js"
import { InvalidModelDirectory, type ModelDirectory } from "./ModelDirectory.js"

/**
 * Which ONNX files of a model directory an LLM runs, and how its decoder is called. The community
 * exports text LLMs in the decoder-only layout (onnx/model.onnx taking input_ids) and VLMs in the
 * split layout (onnx/embed_tokens.onnx, then onnx/decoder_model_merged.onnx taking inputs_embeds,
 * so that media features can be written into the prompt's embeddings); each file comes in one or
 * more dtypes (model_q4.onnx, ...). The decoder's inputs are read from the graph, not assumed.
 */

export type DecoderLayoutName = "decoder-only" | "split"

export const supportedLayouts =
  "the decoder-only layout (onnx/model.onnx: input_ids, attention_mask, [position_ids], past_key_values.N.key/value → logits, present.N.key/value) or the split layout (onnx/embed_tokens.onnx and onnx/decoder_model_merged.onnx taking inputs_embeds)"

export interface DecoderFiles {
  readonly layout: DecoderLayoutName
  readonly dtype: Dtype
  /** Absolute paths. */
  readonly decoder: string
  readonly embedTokens?: string
  readonly vision?: string
  readonly audio?: string
}

/** The dtypes each onnx/ stem is there in. */
const variants = (model: ModelDirectory): ReadonlyMap<string, ReadonlySet<Dtype>> => {
  const found = new Map<string, Set<Dtype>>()
  for (const name of model.onnx.keys()) {
    const parsed = parseOnnxFileName(`${name}.onnx`)
    if (parsed === undefined) continue
    const set = found.get(parsed.stem) ?? new Set<Dtype>()
    set.add(parsed.dtype)
    found.set(parsed.stem, set)
  }
  return found
}

const path = (model: ModelDirectory, stem: string, dtype: Dtype): string =>
  model.onnx.get(onnxFileName(stem, dtype).slice(0, -".onnx".length))!

/**
 * The files to run at `requested` (or by default fp32 when there, else the dtype that loses the
 * least precision among those there), or an error that names what is missing and what is there.
 */
export const decoderFiles = (model: ModelDirectory, requested?: Dtype): DecoderFiles => {
  const found = variants(model)
  const split = found.has("decoder_model_merged") || found.has("embed_tokens")
  const layout: DecoderLayoutName | undefined = split ? "split" : found.has("model") ? "decoder-only" : undefined
  const listing = [...model.onnx.keys()].map((stem) => `onnx/${stem}.onnx`).join(", ")
  if (layout === undefined) {
    throw new InvalidModelDirectory({
      path: model.path,
      reason: `it is not an LLM in a supported layout: it needs ${supportedLayouts}; it has ${listing}`
    })
  }
  const stems = layout === "split" ? ["embed_tokens", "decoder_model_merged"] : ["model"]
  for (const stem of stems) {
    if (!found.has(stem)) {
      throw new InvalidModelDirectory({
        path: model.path,
        reason: `it is in the split layout but has no onnx/${stem}.onnx in any dtype (it has ${listing})`
      })
    }
  }
  const available = dtypes.filter((dtype) => stems.every((stem) => found.get(stem)!.has(dtype)))
  if (available.length === 0) {
    throw new InvalidModelDirectory({
      path: model.path,
      reason: `no dtype has all of ${stems.map((stem) => `onnx/${stem}.onnx`).join(" and ")} (it has ${listing})`
    })
  }
  if (requested !== undefined && !available.includes(requested)) {
    throw new InvalidModelDirectory({
      path: model.path,
      reason: `it has no ${requested} export (${stems.map((stem) => onnxFileName(stem, requested)).join(", ")}); the dtypes it has: ${available.join(", ")}`
    })
  }
  const dtype = requested ?? dtypePreference.find((candidate) => available.includes(candidate))!
  /** An encoder at the decoder's dtype when it is there, else at the best one there. */
  const encoder = (stem: string): string | undefined => {
    const there = found.get(stem)
    if (there === undefined) return undefined
    const chosen = there.has(dtype) ? dtype : dtypePreference.find((candidate) => there.has(candidate))!
    return path(model, stem, chosen)
  }
  const vision = layout === "split" ? encoder("vision_encoder") : undefined
  const audio = layout === "split" ? encoder("audio_encoder") : undefined
  return {
    layout,
    dtype,
    decoder: path(model, stems[stems.length - 1]!, dtype),
    ...(layout === "split" ? { embedTokens: path(model, "embed_tokens", dtype) } : {}),
    ...(vision === undefined ? {} : { vision }),
    ...(audio === undefined ? {} : { audio })
  }
}

/** A tensor input or output of a graph as ONNX Runtime describes it. */
export interface GraphValue {
  readonly name: string
  readonly type: string
  readonly shape: ReadonlyArray<number | string>
}

export type CacheType = "float32" | "float16"

/** One layer's cache: the names it goes in and comes out under. */
export interface CacheNames {
  readonly input: string
  readonly output: string
}

/** How the decoder is called: what it takes besides the past, and the past itself. */
export interface DecoderInterface {
  /** input_ids (decoder-only) or inputs_embeds (split). */
  readonly tokens: "input_ids" | "inputs_embeds"
  /** The element type of inputs_embeds in the split layout. */
  readonly embedsType: CacheType
  readonly positionIds: boolean
  /** 3 where position_ids is [3, batch, sequence] (Qwen2-VL's multimodal rotary positions), else 1. */
  readonly positionAxes: 1 | 3
  /** The first token's position (DecoderSpec's `firstPosition`). */
  readonly firstPosition: 0 | 1
  /** Older merged exports switch between their prefill and decode branches on this bool. */
  readonly useCacheBranch: boolean
  /** Exports that can compute logits for the last positions only. */
  readonly numLogitsToKeep: boolean
  /** Key then value of each layer, in layer order. */
  readonly cache: ReadonlyArray<CacheNames>
  readonly cacheType: CacheType
  readonly kvHeads: number
  readonly headDim: number
  readonly logitsType: CacheType
}

/** Cache input names in the namings exporters use: past_key_values.N.key, past.N.key, past_key_values.N.decoder.key. */
const pastPattern = /^(?:past_key_values|past)\.(\d+)\.(?:decoder\.)?(key|value)$/
const presentPattern = /^(?:present|present_key_values)\.(\d+)\.(?:decoder\.)?(key|value)$/

const floatType = (value: GraphValue, file: string, path: string): CacheType => {
  if (value.type === "float32" || value.type === "float16") return value.type
  throw new InvalidModelDirectory({ path, reason: `${file}: ${value.name} is ${value.type}, not float32 or float16` })
}

/**
 * Reads the decoder's interface from its graph's inputs and outputs; `layers`, `kvHeads` and
 * `headDim` (from config.json) are checked against it.
 */
export const decoderInterface = (
  inputs: ReadonlyArray<GraphValue>,
  outputs: ReadonlyArray<GraphValue>,
  expected: {
    readonly layers: number
    readonly kvHeads: number
    readonly headDim: number
    readonly firstPosition?: 0 | 1
  },
  file: string,
  path: string
): DecoderInterface => {
  const fail = (reason: string): never => {
    throw new InvalidModelDirectory({ path, reason: `${file}: ${reason}; supported: ${supportedLayouts}` })
  }
  const byName = new Map(inputs.map((value) => [value.name, value]))
  const tokens = byName.has("input_ids") ? "input_ids" : byName.has("inputs_embeds") ? "inputs_embeds" : undefined
  if (tokens === undefined)
    fail(`it takes neither input_ids nor inputs_embeds (its inputs: ${inputs.map((v) => v.name).join(", ")})`)
  if (!byName.has("attention_mask")) fail("it has no attention_mask input")
  const pasts = new Map<string, GraphValue>()
  const known = new Set(["input_ids", "inputs_embeds", "attention_mask", "position_ids", "use_cache_branch"])
  known.add("num_logits_to_keep")
  for (const value of inputs) {
    const match = pastPattern.exec(value.name)
    if (match !== null) pasts.set(`${match[1]}.${match[2]}`, value)
    else if (!known.has(value.name)) fail(`its input ${value.name} is not one the platform knows how to fill`)
  }
  const presents = new Map<string, string>()
  for (const value of outputs) {
    const match = presentPattern.exec(value.name)
    if (match !== null) presents.set(`${match[1]}.${match[2]}`, value.name)
  }
  const logits = outputs.find((value) => value.name === "logits")
  if (logits === undefined) fail("it has no logits output")
  if (pasts.size !== expected.layers * 2) {
    fail(
      `it takes ${pasts.size} cache inputs, but config.json describes ${expected.layers} layers (${expected.layers * 2} inputs past_key_values.N.key/value)`
    )
  }
  const cache: Array<CacheNames> = []
  for (let layer = 0; layer < expected.layers; layer++) {
    for (const kind of ["key", "value"]) {
      const input = pasts.get(`${layer}.${kind}`)
      const output = presents.get(`${layer}.${kind}`)
      if (input === undefined) fail(`it has no cache input for layer ${layer}'s ${kind}`)
      if (output === undefined) fail(`it has no output present.${layer}.${kind} for the cache input ${input!.name}`)
      cache.push({ input: input!.name, output: output! })
    }
  }
  const first = pasts.get("0.key")!
  const cacheType = floatType(first, file, path)
  const [, heads, , dim] = first.shape
  const kvHeads = typeof heads === "number" ? heads : expected.kvHeads
  const headDim = typeof dim === "number" ? dim : expected.headDim
  if (kvHeads !== expected.kvHeads || headDim !== expected.headDim) {
    fail(
      `its cache is [batch, ${kvHeads}, positions, ${headDim}], but config.json gives ${expected.kvHeads} key-value heads of ${expected.headDim}`
    )
  }
  return {
    tokens: tokens!,
    embedsType: tokens === "inputs_embeds" ? floatType(byName.get("inputs_embeds")!, file, path) : "float32",
    positionIds: byName.has("position_ids"),
    positionAxes: byName.get("position_ids")?.shape.length === 3 ? 3 : 1,
    firstPosition: expected.firstPosition ?? 0,
    useCacheBranch: byName.has("use_cache_branch"),
    numLogitsToKeep: byName.has("num_logits_to_keep"),
    cache,
    cacheType,
    kvHeads,
    headDim,
    logitsType: floatType(logits!, file, path)
  }
}
