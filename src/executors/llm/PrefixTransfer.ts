/**
 * A prompt's KV cache moved between two LLM executors of the same model: the building block of
 * prefill and decode apart. One runner computes the keys and values of all of the prompt but its
 * last token (which the receiving side runs to draw the first token), after the leading blocks its
 * prefix cache holds, a key and a value array a layer; the other starts the request's cache from them when the same
 * prompt joins (StepItem's `imported`), copying them once, into the request's own cache, and runs
 * only the last token. Only the numbers travel: the receiver is given the prompt, which must be the
 * one they were computed for (the same request, prefilled by an executor of the same model,
 * through the sidecar's authenticated peers).
 */
import type { KvGeometry } from "./KvLayout.js"
import type { CacheArray, PastData } from "./PastCache.js"
import { blockKeys } from "./PrefixCache.js"
import type { PromptInput } from "./protocol.js"
import type { Runner } from "./Runner.js"

/**
 * An exported prefix: a key and a value array per layer, in cache order, each [heads, positions,
 * headDim]; `shape` is [tensors, heads, positions, headDim].
 */
export interface ExportedPrefix {
  readonly tensors: ReadonlyArray<CacheArray>
  readonly shape: readonly [tensors: number, heads: number, positions: number, headDim: number]
}

/**
 * The keys and values of `prompt` but its last token, computed by `runner`'s decoder alone after
 * the leading blocks its prefix cache holds (`cached` positions of them), whose blocks it keeps
 * for the next turn of the same chat.
 */
export const exportPrefix = async (
  runner: Runner,
  prompt: PromptInput
): Promise<ExportedPrefix & { readonly cached: number }> => {
  const { tensors, heads, headDim, half } = runner.cacheGeometry
  // One token is left to run: its logits give the first token.
  const positions = prompt.inputIds.length - 1
  if (positions === 0) {
    const empty = half ? new Uint16Array(0) : new Float32Array(0)
    return { tensors: runner.presentNames.map(() => empty), shape: [tensors, heads, 0, headDim], cached: 0 }
  }
  const cache = runner.prefixCache
  const keys = cache === undefined ? [] : blockKeys(prompt, cache.blockTokens)
  // At least one position is run: the decoder needs a token.
  const found = cache === undefined ? 0 : cache.lookup(keys, Math.floor((positions - 1) / cache.blockTokens))
  const after = found === 0 ? undefined : cache!.read(keys, found)
  const from = after?.width ?? 0
  const outputs = await runner.runAlone(prompt, positions, runner.presentNames, after)
  const arrays = runner.presentNames.map((name, t) => {
    const present = outputs[name]!
    const width = present.dims[2]!
    if (
      present.dims.join() !== [1, heads, width, headDim].join() ||
      (width !== positions && width !== positions - from)
    )
      throw new Error(`${name} is [${present.dims.join(", ")}], not [1, ${heads}, ${positions}, ${headDim}]`)
    const data = present.data as CacheArray
    if (half !== data instanceof Uint16Array) throw new Error(`${name} is not ${half ? "float16" : "float32"}`)
    if (width === positions) return data
    // The positions run alone (a decoder on the shared cache gives only those): the cached ones go first.
    const whole = half ? new Uint16Array(heads * positions * headDim) : new Float32Array(heads * positions * headDim)
    const cached = after!.tensors[t]!
    for (let h = 0; h < heads; h++) {
      whole.set(cached.subarray(h * from * headDim, (h + 1) * from * headDim), h * positions * headDim)
      whole.set(data.subarray(h * width * headDim, (h + 1) * width * headDim), (h * positions + from) * headDim)
    }
    return whole
  })
  if (cache !== undefined) {
    const blocks = Math.floor(positions / cache.blockTokens)
    cache.insert(keys.slice(0, blocks), {
      past: { tensors: arrays, width: positions },
      row: 0,
      length: positions,
      start: 0
    })
  }
  return { tensors: arrays, shape: [tensors, heads, positions, headDim], cached: from }
}

/**
 * Whether a cache of `shape` and `dtype` fits a model of `geometry` and `prompt`: the same
 * geometry and precision, and positions that leave the prompt a token to run. Answers the
 * positions, or why not.
 */
export const checkPrefix = (
  geometry: KvGeometry,
  prompt: PromptInput,
  shape: ExportedPrefix["shape"],
  dtype: "float32" | "float16"
): { readonly positions: number } | { readonly error: string } => {
  const { tensors, heads, headDim, half } = geometry
  const [sentTensors, sentHeads, positions, sentHeadDim] = shape
  if (sentTensors !== tensors || sentHeads !== heads || sentHeadDim !== headDim)
    return {
      error: `the cache sent is [${shape.join(", ")}]; this model's is [${tensors}, ${heads}, positions, ${headDim}]`
    }
  if (half !== (dtype === "float16"))
    return { error: `the cache sent is ${dtype}; this model's is ${half ? "float16" : "float32"}` }
  if (positions >= prompt.inputIds.length)
    return { error: `${positions} positions leave none of the prompt's ${prompt.inputIds.length} tokens to run` }
  return { positions }
}

/**
 * An exported prefix of `prompt` as the past a request joining with it starts from (StepItem's
 * `imported`), or why it does not fit `geometry`; undefined for one of no positions.
 */
export const importedPast = (
  geometry: KvGeometry,
  prompt: PromptInput,
  prefix: ExportedPrefix
): { readonly past: PastData | undefined } | { readonly error: string } => {
  const dtype = prefix.tensors.some((array) => array instanceof Uint16Array) ? "float16" : "float32"
  if (prefix.tensors.some((array) => array instanceof Uint16Array !== (dtype === "float16")))
    return { error: "the cache sent mixes float16 and float32 tensors" }
  const checked = checkPrefix(geometry, prompt, prefix.shape, dtype)
  if ("error" in checked) return checked
  const perTensor = geometry.heads * checked.positions * geometry.headDim
  const wrong = prefix.tensors.findIndex((array) => array.length !== perTensor)
  if (prefix.tensors.length !== geometry.tensors || wrong >= 0)
    return {
      error:
        wrong >= 0
          ? `cache tensor ${wrong} holds ${prefix.tensors[wrong]!.length} numbers, not the ${perTensor} its shape says`
          : `the cache sent holds ${prefix.tensors.length} tensors, not the ${geometry.tensors} its shape says`
    }
  return { past: checked.positions === 0 ? undefined : { tensors: prefix.tensors, width: checked.positions } }
}
