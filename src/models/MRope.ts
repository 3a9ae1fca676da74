import * as Schema from "effect/Schema"
import { type GridThw, type VisionGrids, type VisionPadTokens, visionTokenCount } from "./Qwen2VLProcessor.js"

/**
 * Multimodal rotary positions (M-RoPE) of Qwen2-VL, as its get_rope_index computes them for a
 * prompt whose image and video pads are expanded: every position has a temporal, a height and a
 * width component. Qwen2.5-VL's images and Qwen3-VL's take the same positions (Qwen3-VL
 * interleaves the three axes over its rotary frequencies inside its decoder graph, from these).
 *
 * - A text token takes the next position on all three axes: one past the largest position so far.
 * - An image's (video's) tokens, one per merged block in the order the vision encoder gives them,
 *   take start + (t, row, column) over its grid of t × h/merge × w/merge blocks, where start is
 *   the position the next text token would have taken.
 * - The text after it continues from the largest of them plus one.
 *
 * A token decoded after the prompt, at sequence index i, takes i + delta on all three axes, where
 * delta = (largest prompt position + 1) − prompt length: 0 for text, negative with images.
 *
 * Qwen2.5-VL's transformers (Python) spaces a video's temporal positions by its seconds per
 * temporal patch × tokens_per_second; that is not done here (nor by transformers.js, which gives
 * Qwen2.5-VL these positions): a video's temporal patches take t = 0, 1, 2, ...
 */

/** A prompt whose pad tokens do not line up with the grids of its images or videos. */
export class VisionTokenMismatch extends Schema.TaggedError<VisionTokenMismatch>()("VisionTokenMismatch", {
  kind: Schema.Literal("image", "video"),
  /** The pad tokens of this kind in the prompt. */
  tokens: Schema.Int,
  /** The tokens the grids of this kind take. */
  expected: Schema.Int
}) {
  override get message() {
    return this.tokens === this.expected
      ? `the prompt's <|${this.kind}_pad|> tokens are not in runs of its ${this.kind}s' sizes`
      : `the prompt has ${this.tokens} <|${this.kind}_pad|> token(s) where its ${this.kind}s' grids take ${this.expected}`
  }
}

export interface MRopePositions {
  /** [3, sequence], axis by axis: temporal, height, width. */
  readonly positions: Int32Array
  /** Added to a decoded token's sequence index to give its position. */
  readonly delta: number
}

const countOf = (ids: ArrayLike<number>, token: number): number => {
  let n = 0
  for (let i = 0; i < ids.length; i++) if (ids[i] === token) n++
  return n
}

/** The M-RoPE positions of a prompt (token ids, pads expanded) and the delta of the tokens decoded after it. */
export const mropePositions = (
  ids: ArrayLike<number>,
  pads: VisionPadTokens,
  grids: VisionGrids,
  spatialMergeSize: number
): MRopePositions => {
  const kinds = [
    { kind: "image", pad: pads.imagePad, grids: grids.images },
    { kind: "video", pad: pads.videoPad, grids: grids.videos }
  ] as const
  const used = [0, 0]
  const mismatch = (k: 0 | 1) =>
    new VisionTokenMismatch({
      kind: kinds[k].kind,
      tokens: countOf(ids, kinds[k].pad),
      expected: kinds[k].grids.reduce((n, grid) => n + visionTokenCount(grid, spatialMergeSize), 0)
    })

  const length = ids.length
  const positions = new Int32Array(3 * length)
  const [temporal, height, width] = [0, length, 2 * length]
  let next = 0
  let i = 0
  while (i < length) {
    const token = ids[i]!
    const k = token === pads.imagePad ? 0 : token === pads.videoPad ? 1 : undefined
    if (k === undefined) {
      positions[temporal + i] = next
      positions[height + i] = next
      positions[width + i] = next
      next++
      i++
      continue
    }
    const grid: GridThw | undefined = kinds[k].grids[used[k]!++]
    if (grid === undefined) throw mismatch(k)
    const t = grid[0]
    const rows = Math.floor(grid[1] / spatialMergeSize)
    const cols = Math.floor(grid[2] / spatialMergeSize)
    const size = t * rows * cols
    if (i + size > length) throw mismatch(k)
    for (let j = i; j < i + size; j++) if (ids[j] !== token) throw mismatch(k)
    for (let j = 0; j < size; j++) {
      positions[temporal + i + j] = next + Math.floor(j / (rows * cols))
      positions[height + i + j] = next + (Math.floor(j / cols) % rows)
      positions[width + i + j] = next + (j % cols)
    }
    next += Math.max(t, rows, cols)
    i += size
  }
  for (const k of [0, 1] as const) if (used[k] !== kinds[k].grids.length) throw mismatch(k)
  return { positions, delta: next - length }
}
