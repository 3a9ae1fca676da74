import type { Sharp } from "sharp"

/** sharp's affine interpolator for each of PIL's resample filters that transformers.js maps to one. */
const affineInterpolators = { 0: "nearest", 2: "bilinear", 3: "bicubic", 4: "bilinear", 5: "bilinear" } as const

/**
 * transformers.js's RawImage.resize under Node, as a step on `source` (an image of `from`'s size):
 * Lanczos (resample 1) through sharp's resize, the other filters through an affine scale. Processors
 * that must give transformers.js's pixels resize through here.
 */
export const rawImageResize = (
  source: Sharp,
  from: { readonly width: number; readonly height: number },
  to: { readonly width: number; readonly height: number },
  resample: number
): Sharp =>
  resample === 1
    ? source.resize({ width: to.width, height: to.height, fit: "fill", kernel: "lanczos3" })
    : source.affine([to.width / from.width, 0, 0, to.height / from.height], {
        interpolator: affineInterpolators[resample as keyof typeof affineInterpolators]
      })
