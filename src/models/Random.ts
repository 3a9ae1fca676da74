/**
 * A seeded pseudo-random generator (mulberry32 with Box–Muller normals). Benchmark weights come
 * from it so that every build of a preset writes the same bytes.
 */
export class Random {
  private state: number
  private spareNormal: number | undefined

  constructor(seed: number) {
    this.state = seed >>> 0
  }

  /** Uniform in [0, 1). */
  uniform(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0
    let t = this.state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }

  normal(): number {
    if (this.spareNormal !== undefined) {
      const spare = this.spareNormal
      this.spareNormal = undefined
      return spare
    }
    const radius = Math.sqrt(-2 * Math.log(1 - this.uniform()))
    const angle = 2 * Math.PI * this.uniform()
    this.spareNormal = radius * Math.sin(angle)
    return radius * Math.cos(angle)
  }

  /** `count` normal values with standard deviation `std`. */
  normals(count: number, std: number): Float32Array {
    const out = new Float32Array(count)
    for (let i = 0; i < count; i++) out[i] = this.normal() * std
    return out
  }

  /** An integer in [0, bound). */
  below(bound: number): number {
    return Math.floor(this.uniform() * bound)
  }
}
