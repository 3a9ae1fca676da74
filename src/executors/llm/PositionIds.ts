/**
 * The decoder's position_ids for each kind of run, on one axis, or Qwen2-VL's three (temporal,
 * height, width: its multimodal rotary positions, M-RoPE), laid out [axes, batch, length].
 */
import type { PromptInput } from "./protocol.js"

/** Where a prompt's tokens are: `at(axis, p)` is token p's position on an axis; `delta` carries on past the prompt. */
export interface PromptPositions {
  readonly at: (axis: number, p: number) => number
  /** Added to a token's index to give its position (M-RoPE after media; 0 otherwise). */
  readonly delta: number
}

/**
 * Each token's position in a prompt, axis by axis: its M-RoPE positions where the prompt has
 * them, index + delta past them, the index (plus `first`, for a model that counts from 1) on
 * every axis without them.
 */
export const promptPositions = (prompt: PromptInput, axes: 1 | 3, first: 0 | 1 = 0): PromptPositions => {
  const rope = axes === 3 ? prompt.rope : undefined
  if (rope === undefined) return { at: (_, p) => p + first, delta: first }
  const length = rope.positions.length / 3
  return {
    at: (axis, p) => (p < length ? rope.positions[axis * length + p]! : p + rope.delta),
    delta: rope.delta
  }
}

/** Positions [from, to) of one prompt, as one row. */
export const piecePositions = (located: PromptPositions, from: number, to: number, axes: 1 | 3): BigInt64Array => {
  const count = to - from
  const positions = new BigInt64Array(axes * count)
  for (let axis = 0; axis < axes; axis++)
    for (let p = from; p < to; p++) positions[axis * count + p - from] = BigInt(located.at(axis, p))
  return positions
}

/** Prompts' positions, each a row left-padded to `width`. */
export const paddedPositions = (
  prompts: ReadonlyArray<{ readonly located: PromptPositions; readonly length: number }>,
  width: number,
  axes: 1 | 3
): BigInt64Array => {
  const batch = prompts.length
  // Padding takes position 1, as transformers gives masked positions; the mask hides it anyway.
  const positions = new BigInt64Array(axes * batch * width).fill(1n)
  prompts.forEach(({ located, length }, row) => {
    for (let axis = 0; axis < axes; axis++) {
      const base = (axis * batch + row) * width + width - length
      for (let p = 0; p < length; p++) positions[base + p] = BigInt(located.at(axis, p))
    }
  })
  return positions
}

/** One position per row (a decode step's), the same on every axis. */
export const stepPositions = (next: ReadonlyArray<number>, axes: 1 | 3): BigInt64Array => {
  const one = BigInt64Array.from(next, BigInt)
  if (axes === 1) return one
  const positions = new BigInt64Array(3 * one.length)
  for (let axis = 0; axis < 3; axis++) positions.set(one, axis * one.length)
  return positions
}
