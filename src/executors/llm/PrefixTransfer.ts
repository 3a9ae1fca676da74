/**
 * A prompt's KV cache moved between two LLM executors of the same model, as prefix cache blocks:
 * the building block of prefill and decode apart. One runner computes the keys and values of the
 * prompt's whole blocks (all but its last token, which the receiving side runs to draw the first
 * token), a key and a value array a layer as the decoder gave them; the other puts them into its
 * prefix cache under the prompt's own
 * block keys, so that the same prompt joining it there is prefilled only from where they end, as
 * after any prefix cache hit. Only the numbers travel: the receiver keys them by the prompt it is
 * given, which must be the one they were computed for (the same request, prefilled by an executor
 * of the same model, through the sidecar's authenticated peers).
 */
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

const noCache = "this executor keeps no prefix cache (its decoder runs prompts apart, or its prefix cache is off)"

/** The keys and values of `prompt`'s whole blocks but its last token's, computed by `runner`'s decoder alone. */
export const exportPrefix = async (
  runner: Runner,
  prompt: PromptInput
): Promise<ExportedPrefix | { readonly error: string }> => {
  const cache = runner.prefixCache
  if (cache === undefined) return { error: noCache }
  const { tensors, heads, headDim, half } = cache.geometry
  // At least one token is left to run: its logits give the first token.
  const positions = Math.floor((prompt.inputIds.length - 1) / cache.blockTokens) * cache.blockTokens
  // A prompt shorter than a block and a token has nothing to send: the receiver prefills it all.
  if (positions === 0) {
    const empty = half ? new Uint16Array(0) : new Float32Array(0)
    return { tensors: runner.presentNames.map(() => empty), shape: [tensors, heads, 0, headDim] }
  }
  const outputs = await runner.runAlone(prompt, positions, runner.presentNames)
  const arrays = runner.presentNames.map((name) => {
    const present = outputs[name]!
    if (present.dims.join() !== [1, heads, positions, headDim].join())
      throw new Error(`${name} is [${present.dims.join(", ")}], not [1, ${heads}, ${positions}, ${headDim}]`)
    const data = present.data as CacheArray
    if (half !== data instanceof Uint16Array) throw new Error(`${name} is not ${half ? "float16" : "float32"}`)
    return data
  })
  return { tensors: arrays, shape: [tensors, heads, positions, headDim] }
}

/**
 * Puts an exported prefix of `prompt` into `runner`'s prefix cache; answers how many positions it
 * holds, or why it cannot (another geometry or precision, a length that is not the prompt's whole blocks).
 */
export const importPrefix = (
  runner: Runner,
  prompt: PromptInput,
  prefix: ExportedPrefix
): { readonly positions: number } | { readonly error: string } => {
  const cache = runner.prefixCache
  if (cache === undefined) return { error: noCache }
  const { tensors, heads, headDim, half } = cache.geometry
  const [sentTensors, sentHeads, positions, sentHeadDim] = prefix.shape
  const B = cache.blockTokens
  if (sentTensors !== tensors || sentHeads !== heads || sentHeadDim !== headDim)
    return {
      error: `the cache sent is [${prefix.shape.join(", ")}]; this model's is [${tensors}, ${heads}, positions, ${headDim}]`
    }
  if (prefix.tensors.some((array) => half !== array instanceof Uint16Array))
    return {
      error: `the cache sent is ${half ? "float32" : "float16"}; this model's is ${half ? "float16" : "float32"}`
    }
  if (positions === 0 && prefix.tensors.length === tensors && prefix.tensors.every((array) => array.length === 0))
    return { positions: 0 }
  const keys = blockKeys(prompt, B)
  if (positions % B !== 0 || positions === 0 || positions / B > keys.length || positions >= prompt.inputIds.length)
    return {
      error: `${positions} positions are not whole blocks of ${B} within the prompt's ${prompt.inputIds.length} tokens`
    }
  const perTensor = heads * positions * headDim
  const wrong = prefix.tensors.findIndex((array) => array.length !== perTensor)
  if (prefix.tensors.length !== tensors || wrong >= 0)
    return {
      error:
        wrong >= 0
          ? `cache tensor ${wrong} holds ${prefix.tensors[wrong]!.length} numbers, not the ${perTensor} its shape says`
          : `the cache sent holds ${prefix.tensors.length} tensors, not the ${tensors} its shape says`
    }
  const past: PastData = { tensors: prefix.tensors, width: positions }
  cache.insert(keys.slice(0, positions / B), { past, row: 0, length: positions, start: 0 })
  return { positions }
}
