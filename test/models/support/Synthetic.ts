import type { NamedColor } from "../../../src/models/recipes/ColorChannels.js"
import type { Random } from "../../../src/models/Random.js"
import type { RgbImage } from "../../../src/models/ImageProcessor.js"

/** Generated test inputs: images with a known dominant colour, tones with a known pitch. */

export type ImageStyle = "solid" | "noisy" | "patch" | "noisy-patch"

export interface ColorImage {
  readonly image: RgbImage
  readonly dominant: NamedColor
  readonly style: ImageStyle
}

/**
 * An image whose dominant colour is `dominant`: each channel shaded within 0.25 of full or none,
 * with pixel noise (σ up to 0.15) and/or a rectangle of another colour covering under 40% of it.
 */
export const colorImage = (
  random: Random,
  dominant: NamedColor,
  minority: NamedColor,
  style: ImageStyle
): ColorImage => {
  const width = 40 + random.below(160)
  const height = 40 + random.below(160)
  const shade = (rgb: ReadonlyArray<number>) =>
    rgb.map((on) => (on === 1 ? 1 - 0.25 * random.uniform() : 0.25 * random.uniform()))
  const base = shade(dominant.rgb)
  const other = shade(minority.rgb)
  const noise = style === "noisy" || style === "noisy-patch" ? 0.05 + 0.1 * random.uniform() : 0
  let patch = { left: 0, top: 0, right: 0, bottom: 0 }
  if (style === "patch" || style === "noisy-patch") {
    const area = 0.1 + 0.29 * random.uniform()
    const aspect = 0.5 + random.uniform()
    const w = Math.min(width, Math.max(1, Math.round(Math.sqrt(area * width * height * aspect))))
    const h = Math.min(height, Math.max(1, Math.floor((area * width * height) / w)))
    const left = random.below(width - w + 1)
    const top = random.below(height - h + 1)
    patch = { left, top, right: left + w, bottom: top + h }
  }
  const data = new Uint8Array(width * height * 3)
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const inPatch = x >= patch.left && x < patch.right && y >= patch.top && y < patch.bottom
      const rgb = inPatch ? other : base
      for (let c = 0; c < 3; c++) {
        const value = rgb[c]! + noise * random.normal()
        data[(y * width + x) * 3 + c] = Math.round(255 * Math.min(1, Math.max(0, value)))
      }
    }
  }
  return { image: { data, width, height }, dominant, style }
}

/** A sine tone of `hertz` at `sampleRate`, `seconds` long, amplitude in (0, 1]. */
export const tone = (hertz: number, sampleRate: number, seconds: number, amplitude: number): Float32Array =>
  Float32Array.from(
    { length: Math.round(sampleRate * seconds) },
    (_, i) => amplitude * Math.sin((2 * Math.PI * hertz * i) / sampleRate)
  )
