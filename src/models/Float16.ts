/**
 * IEEE 754 half precision as ONNX Runtime takes it in Node: the 16-bit patterns in a Uint16Array
 * (Node 20 has no Float16Array). Conversions round to nearest, ties to even.
 */

const floatView = new Float32Array(1)
const bitsView = new Uint32Array(floatView.buffer)

/** The half-precision bits of `value`. */
export const toHalf = (value: number): number => {
  floatView[0] = value
  const bits = bitsView[0]!
  const sign = (bits >>> 16) & 0x8000
  const exponent = (bits >>> 23) & 0xff
  const mantissa = bits & 0x7fffff
  if (exponent === 0xff) return sign | 0x7c00 | (mantissa === 0 ? 0 : 0x200)
  const halfExponent = exponent - 127 + 15
  if (halfExponent >= 0x1f) return sign | 0x7c00
  if (halfExponent <= 0) {
    if (halfExponent < -10) return sign
    const full = mantissa | 0x800000
    const shift = 14 - halfExponent
    const half = full >>> shift
    const rest = full & ((1 << shift) - 1)
    const midpoint = 1 << (shift - 1)
    return sign | (half + (rest > midpoint || (rest === midpoint && (half & 1) === 1) ? 1 : 0))
  }
  const half = (halfExponent << 10) | (mantissa >>> 13)
  const rest = mantissa & 0x1fff
  // A carry out of the mantissa correctly bumps the exponent (up to infinity).
  return sign | (half + (rest > 0x1000 || (rest === 0x1000 && (half & 1) === 1) ? 1 : 0))
}

/** The value of half-precision bits `half`. */
export const fromHalf = (half: number): number => {
  const sign = half & 0x8000 ? -1 : 1
  const exponent = (half >>> 10) & 0x1f
  const mantissa = half & 0x3ff
  if (exponent === 0) return sign * mantissa * 2 ** -24
  if (exponent === 0x1f) return mantissa === 0 ? sign * Infinity : Number.NaN
  return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15)
}

export const halvesOf = (values: ArrayLike<number>): Uint16Array => {
  const out = new Uint16Array(values.length)
  for (let i = 0; i < values.length; i++) out[i] = toHalf(values[i]!)
  return out
}

/** `halves[from, to)` as float32. */
export const floatsOf = (halves: Uint16Array, from = 0, to = halves.length): Float32Array => {
  const out = new Float32Array(to - from)
  for (let i = from; i < to; i++) out[i - from] = fromHalf(halves[i]!)
  return out
}
