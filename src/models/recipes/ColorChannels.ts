import type { Matrix } from "../Weights.js"

/**
 * The residual-stream layout of the constructed colour models (tiny-color-vlm, and the painter and
 * tones that read its token embeddings). Each of the 64 channels has a role; channel c + 32
 * always holds the negation of channel c. That mirror keeps the mean of every row at exactly 0, so
 * a LayerNorm (γ = 1, β = 0) only rescales a row, and reading a channel as (c − mirror)/2 ignores
 * any shift. Logic written as linear read-outs therefore survives the norms unchanged.
 */

export interface NamedColor {
  readonly name: string
  /** Each channel full on or off: the eight corners of the RGB cube. */
  readonly rgb: readonly [number, number, number]
}

export const colors: ReadonlyArray<NamedColor> = [
  { name: "red", rgb: [1, 0, 0] },
  { name: "green", rgb: [0, 1, 0] },
  { name: "blue", rgb: [0, 0, 1] },
  { name: "yellow", rgb: [1, 1, 0] },
  { name: "cyan", rgb: [0, 1, 1] },
  { name: "magenta", rgb: [1, 0, 1] },
  { name: "white", rgb: [1, 1, 1] },
  { name: "black", rgb: [0, 0, 0] }
]

export const hiddenSize = 64
const mirrorOffset = hiddenSize / 2

/** Primary channels; each name is the first of `width` consecutive channels. */
export const channel = {
  /** 1 on every token of the vocabulary. */
  text: 0,
  /** Set on the rows of image features. */
  image: 1,
  /** Set on the rows of audio features. */
  audio: 2,
  /** Per image patch, ±1 for whether R, G, B are above half. */
  imageBits: 3,
  /** Pads image feature rows to a fixed norm, so attention treats all patches alike. */
  imageCompletion: 6,
  /** Per audio frame, (high − low)/(high + low) band power, in [-1, 1]. */
  pitch: 7,
  pitchCompletion: 8,
  /** Set on answer words: having just said one, the model says end-of-turn. */
  answer: 9,
  /** Set on colour names in any spelling; what the painter and tones look for. */
  colorWord: 10,
  /** ±1 per RGB channel of the named colour. */
  wordBits: 11,
  /** Four (cos, sin) pairs of the position. */
  position: 14,
  /** Written by the decoder's first layer: the share of attention on image rows (≈ 1 when an image is present). */
  imagePresent: 22,
  /** Mean of imageBits over all image rows: the per-channel majority vote. */
  pooledBits: 23,
  audioPresent: 26,
  pooledPitch: 27,
  /** The vote, saturated to ±1 by the first layer's MLP. */
  colorDecision: 28,
  pitchDecision: 31
} as const

export const positionPairs = 4

const mirrorOf = (c: number): number => c + mirrorOffset

/** Sets channel c of a row to `value` and its mirror to −value. */
export const setMirrored = (row: Float32Array, c: number, value: number, offset = 0): void => {
  row[offset + c] = value
  row[offset + mirrorOf(c)] = -value
}

/** A weight matrix [hidden, out] reading channel c into column `column` with gain `gain`. */
export const readChannel = (m: Matrix, c: number, column: number, gain: number): void => {
  m.data[c * m.cols + column]! += gain / 2
  m.data[mirrorOf(c) * m.cols + column]! -= gain / 2
}

/** A weight matrix [in, hidden] writing input `row` into channel c with gain `gain`. */
export const writeChannel = (m: Matrix, row: number, c: number, gain: number): void => {
  setMirrored(m.data, c, gain, row * m.cols)
}

/** ±1 per RGB channel. */
export const colorBits = (color: NamedColor): ReadonlyArray<number> => color.rgb.map((on) => 2 * on - 1)
