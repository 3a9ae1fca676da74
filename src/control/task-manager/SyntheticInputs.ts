/**
 * What a profile recording's synthetic calls send (ProfileRecorder.ts): short prompts, small media
 * generated here, and the shapes a codec's or a generator's inputs take, read from the model's
 * config.json on this machine (or why they cannot be).
 */
import { join } from "node:path"

/** Short chat prompts, a few tokens' answer each (text embedders embed them too). */
export const prompts = [
  "What colour is the sky?",
  "Name a colour.",
  "Say hello in one word.",
  "Count from one to three.",
  "What is two plus two?"
]

const dataUrl = (mimeType: string, bytes: Uint8Array) =>
  `data:${mimeType};base64,${Buffer.from(bytes).toString("base64")}`

/** An RGB square of one colour, as PNG. */
const squarePng = async (size: number, [red, green, blue]: readonly [number, number, number]) => {
  const { default: sharp } = await import("sharp")
  const pixels = Buffer.alloc(size * size * 3)
  for (let at = 0; at < pixels.length; at += 3) pixels.set([red, green, blue], at)
  return sharp(pixels, { raw: { width: size, height: size, channels: 3 } })
    .png()
    .toBuffer()
}

/** A small media item of the modality, as a `data:` URL: what an encoder embeds in a profile's calls. */
export const syntheticMedia = async (modality: string): Promise<string> => {
  if (modality === "image") return dataUrl("image/png", await squarePng(64, [200, 40, 40]))
  if (modality === "video") {
    const { default: sharp } = await import("sharp")
    const colours = [
      [200, 40, 40],
      [40, 200, 40],
      [40, 40, 200],
      [200, 200, 40]
    ] as const
    const frames = await Promise.all(colours.map((colour) => squarePng(64, colour)))
    return dataUrl(
      "image/gif",
      await sharp(frames, { join: { animated: true } })
        .gif()
        .toBuffer()
    )
  }
  // A second of a 440 Hz tone.
  const { wavFile } = await import("../../executors/geri/router.js")
  const sampleRate = 16_000
  const samples = Int16Array.from({ length: sampleRate }, (_, index) =>
    Math.round(8_000 * Math.sin((2 * Math.PI * 440 * index) / sampleRate))
  )
  return dataUrl("audio/wav", wavFile([samples], sampleRate))
}

/**
 * A model's directory on this machine. A recipe is built by the node that runs it; it is read here
 * only if this machine has it.
 */
const localModelDirectory = async (model: string) => {
  const { benchModelNames, builtinModelNames, modelCacheDir, resolveModel } = await import("../../models/ModelStore.js")
  const { loadModelDirectory } = await import("../../models/ModelDirectory.js")
  const dir =
    builtinModelNames.includes(model) || benchModelNames.includes(model)
      ? join(modelCacheDir(), model)
      : await resolveModel(model, { offline: true })
  return loadModelDirectory(dir)
}

const notHere = (model: string, what: string, error: unknown) =>
  `model ${model} is not on the control plane's machine, where ${what} (${error instanceof Error ? error.message : String(error)})`

/** A codec's codebooks, read from its config.json on this machine, or why they cannot be. */
export const codecModel = async (
  model: string
): Promise<{ readonly quantizers: number; readonly codebookSize: number } | string> => {
  try {
    const config = (await localModelDirectory(model)).rawConfig as { num_quantizers?: number; codebook_size?: number }
    return { quantizers: config.num_quantizers ?? 32, codebookSize: config.codebook_size ?? 2048 }
  } catch (error) {
    return notHere(model, "its codebooks are read", error)
  }
}

/**
 * What a generator's model takes, read from its config.json on this machine: the width of its
 * prompt embeddings and its own image size; or why it cannot be read here.
 */
export const generatorModel = async (
  model: string
): Promise<
  { readonly hidden: number; readonly image: { readonly width: number; readonly height: number } | undefined } | string
> => {
  try {
    const { config } = await localModelDirectory(model)
    if (config.prompt_embeddings === undefined)
      return `the config.json of model ${model} says nothing of the prompt embeddings it takes`
    const generator = config.generator
    return {
      hidden: config.prompt_embeddings.hidden_size,
      image: generator?.modality === "image" ? { width: generator.width, height: generator.height } : undefined
    }
  } catch (error) {
    return notHere(model, "the shape of its input is read", error)
  }
}
