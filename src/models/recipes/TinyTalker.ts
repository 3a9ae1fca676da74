import { type TalkerSize, talkerGraphs, talkerVocabulary } from "../architectures/Talker.js"
import { llamaConfigJson } from "../architectures/Llama.js"
import { hiddenSize as colorVlmHiddenSize } from "./ColorChannels.js"
import { tinyMimiGeometry } from "./RandomMimi.js"
import { jsonFile, type ModelFiles, type ModelRecipe, recipeStamp } from "./Recipe.js"
import { talkerModelType } from "../TalkerModel.js"

/**
 * cornserve/tiny-talker: a random-weight talker (architectures/Talker.ts) that reads
 * cornserve/tiny-color-vlm's final hidden states and writes cornserve/tiny-mimi's frames (8
 * codebooks of 64 codes, 12.5 frames a second): a 2-layer Llama decoder 32 wide and a depth head.
 * Its end-of-speech logit is biased far down, so it speaks until its frame limit (the request's
 * `maxFrames`, 40 frames, 3.2 s, when left out): the length of its answer is known, its codes follow
 * the thinker's hidden states, and its audio is noise shaped by them.
 */

const name = "cornserve/tiny-talker"
const version = 1

export const tinyTalkerSize: TalkerSize = {
  decoder: {
    hiddenSize: 32,
    intermediateSize: 64,
    layers: 2,
    heads: 2,
    kvHeads: 1,
    headDim: 16,
    vocabSize: tinyMimiGeometry.codebookSize + 2,
    maxPositions: 1024,
    ropeTheta: 10000,
    rmsNormEps: 1e-6
  },
  thinkerHiddenSize: colorVlmHiddenSize,
  codebooks: tinyMimiGeometry.numQuantizers,
  codebookSize: tinyMimiGeometry.codebookSize
}

export interface TalkerFilesOptions {
  readonly size?: TalkerSize
  readonly seed?: number
  readonly endBias?: number
  readonly defaultMaxFrames?: number
  readonly config?: Readonly<Record<string, unknown>>
}

/** A talker's model directory: config.json and the four graphs. */
export const talkerFiles = (options: TalkerFilesOptions = {}): ModelFiles => {
  const size = options.size ?? tinyTalkerSize
  if (size.decoder.vocabSize !== talkerVocabulary(size))
    throw new Error(`a talker's decoder vocabulary is its first codebook and two specials: ${talkerVocabulary(size)}`)
  const graphs = talkerGraphs(size, { seed: options.seed ?? 31, std: 0.2, endBias: options.endBias ?? -1000 })
  const config = llamaConfigJson(size.decoder, {
    architectures: ["CornserveTalker"],
    model_type: talkerModelType,
    talker: {
      num_code_groups: size.codebooks,
      codebook_size: size.codebookSize,
      thinker_hidden_size: size.thinkerHiddenSize,
      codec_model: "cornserve/tiny-mimi",
      thinker_model: "cornserve/tiny-color-vlm",
      frame_rate: tinyMimiGeometry.frameRate,
      default_max_frames: options.defaultMaxFrames ?? 40
    },
    ...options.config
  })
  return new Map([
    ["config.json", jsonFile(config)],
    ...[...graphs].map(([stem, graph]): [string, Uint8Array] => [`onnx/${stem}.onnx`, graph.toBytes()])
  ])
}

export const tinyTalker: ModelRecipe = {
  name,
  version,
  build: () => talkerFiles({ config: { cornserve: recipeStamp({ name, version }) } })
}
