/**
 * Band-limited resampling of mono audio: each output sample is the input convolved with a
 * windowed sinc (Kaiser window, β = 9: about 90 dB of stop-band rejection) whose cut-off is 0.95 of
 * the lower of the two Nyquist frequencies, so that content above the output's Nyquist is removed
 * before it can alias (linear interpolation lets it fold back). The filter spans 32 zero crossings
 * of the narrower sinc on each side.
 *
 * The ratio is reduced to up / down (44.1 kHz → 16 kHz is 160 / 441); the filter is tabulated once
 * per output phase (up phases), so each output sample costs one dot product over its taps. Ratios
 * whose up exceeds 4096 (a rate with an odd prime factor above 4096) use 4096 phases and interpolate
 * linearly between them. Samples before the start and past the end count as silence.
 */

const kaiserBeta = 9
const zeroCrossings = 32
const passband = 0.95
const maxPhases = 4096

const gcd = (a: number, b: number): number => (b === 0 ? a : gcd(b, a % b))

/** I0, the zeroth-order modified Bessel function of the first kind, by its power series. */
const besselI0 = (x: number): number => {
  let sum = 1
  let term = 1
  const quarter = (x * x) / 4
  for (let k = 1; k < 64; k++) {
    term *= quarter / (k * k)
    sum += term
    if (term < sum * 1e-17) break
  }
  return sum
}

interface Filter {
  /** Taps per phase; phase p covers input offsets first … first + taps − 1 from its anchor. */
  readonly taps: number
  readonly first: number
  readonly phases: number
  /** [phases + 1][taps]: the last row repeats phase 0 shifted by one input sample, for interpolation. */
  readonly table: Float64Array
}

const filters = new Map<string, Filter>()

/** The tabulated filter for converting `from` Hz to `to` Hz. */
const filterFor = (from: number, to: number): Filter => {
  const key = `${from}:${to}`
  const cached = filters.get(key)
  if (cached !== undefined) return cached
  const divisor = gcd(from, to)
  const up = to / divisor
  const phases = Math.min(up, maxPhases)
  // Cut-off in cycles per input sample, and the half-width in input samples.
  const cutoff = (passband * Math.min(1, to / from)) / 2
  const halfWidth = zeroCrossings / (2 * cutoff)
  const first = -Math.floor(halfWidth)
  const taps = Math.floor(halfWidth) - first + 1
  const table = new Float64Array((phases + 1) * taps)
  const i0Beta = besselI0(kaiserBeta)
  for (let phase = 0; phase <= phases; phase++) {
    // An output at input position anchor + phase / phases takes input anchor + j with weight h(j − phase / phases).
    const fraction = phase / phases
    for (let tap = 0; tap < taps; tap++) {
      const t = first + tap - fraction
      if (Math.abs(t) > halfWidth) continue
      const x = 2 * cutoff * t
      const sinc = x === 0 ? 1 : Math.sin(Math.PI * x) / (Math.PI * x)
      const ratio = t / halfWidth
      const window = besselI0(kaiserBeta * Math.sqrt(Math.max(0, 1 - ratio * ratio))) / i0Beta
      table[phase * taps + tap] = 2 * cutoff * sinc * window
    }
  }
  const filter = { taps, first, phases, table }
  filters.set(key, filter)
  return filter
}

/** `samples` at `from` Hz as samples at `to` Hz: ⌈length · to / from⌉ of them. */
export const resample = (samples: Float32Array, from: number, to: number): Float32Array => {
  if (!Number.isInteger(from) || !Number.isInteger(to) || from <= 0 || to <= 0) {
    throw new Error(`sample rates must be positive integers: ${from} → ${to}`)
  }
  if (from === to || samples.length === 0) return samples
  const { taps, first, phases, table } = filterFor(from, to)
  const divisor = gcd(from, to)
  const up = to / divisor
  const down = from / divisor
  const length = Math.ceil((samples.length * to) / from)
  const out = new Float32Array(length)
  const exact = phases === up
  for (let n = 0; n < length; n++) {
    // Input position n · down / up = anchor + rest / up.
    const numerator = n * down
    const anchor = Math.floor(numerator / up)
    const rest = numerator - anchor * up
    const start = anchor + first
    let sum = 0
    if (exact) {
      const row = rest * taps
      for (let tap = 0; tap < taps; tap++) {
        const at = start + tap
        if (at >= 0 && at < samples.length) sum += samples[at]! * table[row + tap]!
      }
    } else {
      const position = (rest / up) * phases
      const phase = Math.floor(position)
      const weight = position - phase
      const row = phase * taps
      for (let tap = 0; tap < taps; tap++) {
        const at = start + tap
        if (at >= 0 && at < samples.length) {
          const h = table[row + tap]! * (1 - weight) + table[row + taps + tap]! * weight
          sum += samples[at]! * h
        }
      }
    }
    out[n] = sum
  }
  return out
}
