import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { InvalidProcessorConfig, preprocessorConfigFile } from "./Idefics3Processor.js"
import { decodeConfig } from "./ModelDirectory.js"

/**
 * Whisper's log-mel features (WhisperFeatureExtractor), as transformers.js computes them:
 *
 * - the clip is cut or zero-padded to n_samples (30 s), unless the processor does not pad;
 * - it is padded by n_fft / 2 on each side by reflection (a centred STFT), framed every
 *   hop_length samples, each frame weighted by a periodic Hann window of n_fft and transformed
 *   (float64); the power of each of the n_fft / 2 + 1 bins is kept as float32;
 * - the mel filters (the preprocessor config's mel_filters, else Slaney-scale triangles from 0 to
 *   8 kHz with Slaney area normalisation) give feature_size mel bands;
 * - each value is floored at 1e-10, its log10 taken, floored at the largest less 8, then mapped to
 *   (x + 4) / 4;
 * - the last frame is dropped (there are samples ÷ hop_length frames, at most nb_max_frames).
 *
 * The answer is float32 [feature_size, frames], row-major, as input_features holds it.
 */

const Count = Schema.Int.pipe(Schema.positive())

/** preprocessor_config.json of a Whisper-style feature extractor; the defaults are Whisper's. */
export const WhisperFeatureConfig = Schema.Struct({
  feature_size: Schema.optionalWith(Count, { default: () => 80 }),
  sampling_rate: Schema.optionalWith(Count, { default: () => 16000 }),
  hop_length: Schema.optionalWith(Count, { default: () => 160 }),
  chunk_length: Schema.optionalWith(Count, { default: () => 30 }),
  n_fft: Schema.optionalWith(Count, { default: () => 400 }),
  n_samples: Schema.optional(Count),
  nb_max_frames: Schema.optional(Count),
  padding_value: Schema.optionalWith(Schema.Number, { default: () => 0 }),
  /** [feature_size][n_fft / 2 + 1] (or transposed), as older saves of the extractor hold them. */
  mel_filters: Schema.optional(Schema.Array(Schema.Array(Schema.Number)))
})
export type WhisperFeatureConfig = typeof WhisperFeatureConfig.Type

export interface WhisperFeatureExtractor {
  readonly featureSize: number
  readonly samplingRate: number
  readonly hopLength: number
  readonly nFft: number
  readonly nSamples: number
  readonly maxFrames: number
  readonly paddingValue: number
  /** [feature_size × bins], row-major. */
  readonly melFilters: Float64Array
  readonly window: Float64Array
  readonly fft: RealFft
}

/** The extractor a preprocessor_config.json (parsed) describes; one it cannot follow is refused, naming why. */
export const whisperFeatureExtractor = (preprocessorConfig: unknown): WhisperFeatureExtractor => {
  const config = Either.getOrThrowWith(
    decodeConfig(WhisperFeatureConfig, preprocessorConfig ?? {}),
    (reason) =>
      new InvalidProcessorConfig({ file: preprocessorConfigFile, field: "", reason: `is not usable: ${reason}` })
  )
  const bins = Math.floor(config.n_fft / 2) + 1
  const nSamples = config.n_samples ?? config.chunk_length * config.sampling_rate
  return {
    featureSize: config.feature_size,
    samplingRate: config.sampling_rate,
    hopLength: config.hop_length,
    nFft: config.n_fft,
    nSamples,
    maxFrames: config.nb_max_frames ?? Math.floor(nSamples / config.hop_length),
    paddingValue: config.padding_value,
    melFilters:
      config.mel_filters === undefined
        ? slaneyMelFilters(bins, config.feature_size, 0, 8000, config.sampling_rate)
        : givenMelFilters(config.mel_filters, bins, config.feature_size),
    window: periodicHann(config.n_fft),
    fft: new RealFft(config.n_fft)
  }
}

const givenMelFilters = (rows: ReadonlyArray<ReadonlyArray<number>>, bins: number, mels: number): Float64Array => {
  const out = new Float64Array(mels * bins)
  if (rows.length === mels && rows.every((row) => row.length === bins)) {
    rows.forEach((row, mel) => out.set(row, mel * bins))
    return out
  }
  if (rows.length === bins && rows.every((row) => row.length === mels)) {
    rows.forEach((row, bin) => row.forEach((value, mel) => (out[mel * bins + bin] = value)))
    return out
  }
  throw new InvalidProcessorConfig({
    file: preprocessorConfigFile,
    field: "mel_filters",
    reason: `is ${rows.length}×${rows[0]?.length ?? 0}; feature_size ${mels} and n_fft give ${mels}×${bins}`
  })
}

/** A periodic Hann window: 0.5 − 0.5·cos(2πi / n) for i < n. */
export const periodicHann = (n: number): Float64Array =>
  Float64Array.from({ length: n }, (_, i) => 0.5 - 0.5 * Math.cos((2 * Math.PI * i) / n))

const hertzToSlaneyMel = (hertz: number): number =>
  hertz >= 1000 ? 15 + Math.log(hertz / 1000) * (27 / Math.log(6.4)) : (3 * hertz) / 200

const slaneyMelToHertz = (mel: number): number =>
  mel >= 15 ? 1000 * Math.exp((Math.log(6.4) / 27) * (mel - 15)) : (200 * mel) / 3

/**
 * Triangular filters evenly spaced on the Slaney mel scale between `minHertz` and `maxHertz`,
 * each scaled to unit area (Slaney normalisation): [mels × bins], row-major.
 */
export const slaneyMelFilters = (
  bins: number,
  mels: number,
  minHertz: number,
  maxHertz: number,
  samplingRate: number
): Float64Array => {
  const low = hertzToSlaneyMel(minHertz)
  const high = hertzToSlaneyMel(maxHertz)
  const edges = Float64Array.from({ length: mels + 2 }, (_, i) =>
    slaneyMelToHertz(low + ((high - low) / (mels + 1)) * i)
  )
  const binStep = Math.floor(samplingRate / 2) / (bins - 1)
  const out = new Float64Array(mels * bins)
  for (let mel = 0; mel < mels; mel++) {
    const norm = 2 / (edges[mel + 2]! - edges[mel]!)
    for (let bin = 0; bin < bins; bin++) {
      const frequency = binStep * bin
      const down = -(edges[mel]! - frequency) / (edges[mel + 1]! - edges[mel]!)
      const up = (edges[mel + 2]! - frequency) / (edges[mel + 2]! - edges[mel + 1]!)
      out[mel * bins + bin] = Math.max(0, Math.min(down, up)) * norm
    }
  }
  return out
}

/**
 * The discrete Fourier transform of real frames of one length n (any n: mixed radix, each factor's
 * butterfly done directly), in float64; answers the power of bins 0 … n/2.
 */
export class RealFft {
  private readonly factors: ReadonlyArray<number>
  private readonly cos: Float64Array
  private readonly sin: Float64Array
  /** Per level of the recursion, a buffer of that level's length (re, im). */
  private readonly scratch: ReadonlyArray<{ readonly re: Float64Array; readonly im: Float64Array }>
  private readonly outRe: Float64Array
  private readonly outIm: Float64Array

  constructor(readonly n: number) {
    const factors: Array<number> = []
    let rest = n
    for (const p of [4, 2, 3, 5]) {
      while (rest % p === 0) {
        factors.push(p)
        rest /= p
      }
    }
    for (let p = 7; rest > 1; p += 2) {
      while (rest % p === 0) {
        factors.push(p)
        rest /= p
      }
    }
    this.factors = factors
    this.cos = Float64Array.from({ length: n }, (_, i) => Math.cos((2 * Math.PI * i) / n))
    this.sin = Float64Array.from({ length: n }, (_, i) => -Math.sin((2 * Math.PI * i) / n))
    let length = n
    this.scratch = factors.map((p) => {
      const buffer = { re: new Float64Array(length), im: new Float64Array(length) }
      length /= p
      return buffer
    })
    this.outRe = new Float64Array(n)
    this.outIm = new Float64Array(n)
  }

  /** |X[k]|² for k = 0 … n/2 of the real frame `input` (length n), written to `power`. */
  power(input: Float64Array, power: Float32Array): void {
    this.transform(0, input, 0, 1, this.outRe, this.outIm, 0)
    for (let k = 0; k < power.length; k++) power[k] = this.outRe[k]! ** 2 + this.outIm[k]! ** 2
  }

  /** The DFT of input[offset + j·stride] for j < length at this level, into out[at …]. */
  private transform(
    level: number,
    input: Float64Array,
    offset: number,
    stride: number,
    outRe: Float64Array,
    outIm: Float64Array,
    at: number
  ): void {
    if (level === this.factors.length) {
      outRe[at] = input[offset]!
      outIm[at] = 0
      return
    }
    const p = this.factors[level]!
    const length = this.n / stride
    const m = length / p
    const { re, im } = this.scratch[level]!
    for (let r = 0; r < p; r++) this.transform(level + 1, input, offset + r * stride, stride * p, re, im, r * m)
    // X[k + q·m] = Σ_r Y_r[k] · W_length^(r·(k + q·m)), W_length^e = W_n^(e·stride).
    const { cos, sin, n } = this
    for (let k = 0; k < m; k++) {
      for (let q = 0; q < p; q++) {
        const index = k + q * m
        let sumRe = 0
        let sumIm = 0
        for (let r = 0; r < p; r++) {
          const e = (r * index * stride) % n
          const yRe = re[r * m + k]!
          const yIm = im[r * m + k]!
          sumRe += yRe * cos[e]! - yIm * sin[e]!
          sumIm += yRe * sin[e]! + yIm * cos[e]!
        }
        outRe[at + index] = sumRe
        outIm[at + index] = sumIm
      }
    }
  }
}

export interface WhisperFeatureOptions {
  /** Cut or pad the clip to this many samples (n_samples by default); false keeps its length. */
  readonly pad?: boolean
  readonly maxLength?: number
}

/** input_features of one clip of mono samples at the extractor's rate: float32 [feature_size, frames]. */
export const whisperFeatures = (
  extractor: WhisperFeatureExtractor,
  audio: Float32Array,
  options: WhisperFeatureOptions = {}
): { readonly data: Float32Array; readonly frames: number } => {
  const { nFft, hopLength, featureSize, window, fft, melFilters } = extractor
  let waveform: Float32Array
  if (options.pad === false) waveform = audio
  else {
    const length = options.maxLength ?? extractor.nSamples
    waveform = new Float32Array(length)
    if (extractor.paddingValue !== 0) waveform.fill(extractor.paddingValue)
    waveform.set(audio.length > length ? audio.subarray(0, length) : audio)
  }
  if (waveform.length < 2) throw new Error("a clip of fewer than 2 samples has no spectrum")
  const half = Math.floor(nFft / 2)
  // Reflection padding: x[-i] = x[i], x[len - 1 + i] = x[len - 1 - i] (numpy's "reflect").
  const last = waveform.length - 1
  const reflect = (i: number) => Math.abs(((i + last) % (2 * last)) - last)
  const padded = new Float64Array(waveform.length + 2 * half)
  for (let i = 0; i < padded.length; i++) padded[i] = waveform[reflect(i - half)]!
  const frames = Math.min(Math.floor(waveform.length / hopLength), extractor.maxFrames)
  const bins = half + 1
  // Power, [bins, frames] as float32, as transformers.js keeps it.
  const power = new Float32Array(bins * frames)
  const frame = new Float64Array(nFft)
  const column = new Float32Array(bins)
  for (let f = 0; f < frames; f++) {
    const offset = f * hopLength
    for (let j = 0; j < nFft; j++) frame[j] = (offset + j < padded.length ? padded[offset + j]! : 0) * window[j]!
    fft.power(frame, column)
    for (let b = 0; b < bins; b++) power[b * frames + f] = column[b]!
  }
  const filters = Float32Array.from(melFilters)
  const out = new Float32Array(featureSize * frames)
  const sums = new Float32Array(frames)
  for (let mel = 0; mel < featureSize; mel++) {
    sums.fill(0)
    for (let b = 0; b < bins; b++) {
      const weight = filters[mel * bins + b]!
      if (weight === 0) continue
      const row = b * frames
      for (let f = 0; f < frames; f++) sums[f] = sums[f]! + weight * power[row + f]!
    }
    out.set(sums, mel * frames)
  }
  let largest = Number.NEGATIVE_INFINITY
  for (let i = 0; i < out.length; i++) {
    out[i] = Math.log10(Math.max(1e-10, out[i]!))
    if (out[i]! > largest) largest = out[i]!
  }
  const floor = largest - 8
  for (let i = 0; i < out.length; i++) out[i] = (Math.max(out[i]!, floor) + 4) / 4
  return { data: out, frames }
}
