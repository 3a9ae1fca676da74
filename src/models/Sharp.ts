import { createRequire } from "node:module"
import type SharpModule from "sharp"

type SharpFunction = typeof SharpModule

let loaded: SharpFunction | undefined

/**
 * sharp, loaded on its first call. Loading it (libvips and the modules sharp checks its version
 * with) costs about 0.13 s of CPU, and most processes that import an image module never decode an
 * image: an LLM router whose images an encoder executor reads, a worker of a text model. Every
 * module calls sharp through this rather than importing the package.
 */
export const sharp = (...args: Parameters<SharpFunction>): ReturnType<SharpFunction> => {
  loaded ??= createRequire(import.meta.url)("sharp") as SharpFunction
  return loaded(...args)
}
