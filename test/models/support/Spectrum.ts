/** The frequency with the most power in `samples` (radix-2 FFT of the zero-padded signal). */
export const peakFrequency = (samples: ArrayLike<number>, sampleRate: number): number => {
  let size = 1
  while (size < samples.length) size *= 2
  const real = new Float64Array(size)
  const imaginary = new Float64Array(size)
  for (let i = 0; i < samples.length; i++) real[i] = samples[i]!
  for (let i = 1, j = 0; i < size; i++) {
    let bit = size >> 1
    for (; j & bit; bit >>= 1) j ^= bit
    j ^= bit
    if (i < j) {
      ;[real[i], real[j]] = [real[j]!, real[i]!]
      ;[imaginary[i], imaginary[j]] = [imaginary[j]!, imaginary[i]!]
    }
  }
  for (let length = 2; length <= size; length *= 2) {
    const angle = (-2 * Math.PI) / length
    for (let start = 0; start < size; start += length) {
      for (let k = 0; k < length / 2; k++) {
        const [cos, sin] = [Math.cos(angle * k), Math.sin(angle * k)]
        const [a, b] = [start + k, start + k + length / 2]
        const tr = real[b]! * cos - imaginary[b]! * sin
        const ti = real[b]! * sin + imaginary[b]! * cos
        real[b] = real[a]! - tr
        imaginary[b] = imaginary[a]! - ti
        real[a]! += tr
        imaginary[a]! += ti
      }
    }
  }
  let peak = 1
  for (let k = 1; k < size / 2; k++) {
    if (real[k]! ** 2 + imaginary[k]! ** 2 > real[peak]! ** 2 + imaginary[peak]! ** 2) peak = k
  }
  return (peak * sampleRate) / size
}
