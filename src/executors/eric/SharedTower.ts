import { dirname } from "node:path"
import * as ort from "onnxruntime-node"
import { loadModelDirectory, type ModelDirectory } from "../../models/ModelDirectory.js"
import { splitAtProjector } from "../../models/onnx/ProjectorSplit.js"
import { graphWithWeightsInPlace, initializerBytes } from "../../models/onnx/WeightsInPlace.js"
import { createSession } from "../common/Sessions.js"

/**
 * One vision tower serving several models, each with its own projector (the original Cornserve's
 * encoder adapters): Gemma 3's sizes hold the same SigLIP tower and differ in the projector alone.
 * Each model's `vision_encoder.onnx` is cut at the projector's input (ProjectorSplit.ts); the
 * executor's own model's tower is loaded once, and every model's projector beside it, after its
 * tower was found to be the same computation over the same weights (a model whose tower differs is
 * refused: one deployment cannot serve it). The parts keep their weights in the models' files, so
 * ONNX Runtime reads each weight once and the adapters' towers are only read to be hashed.
 */
export interface SharedTowerModel {
  readonly id: string
  readonly dir: string
}

/** What the executor holds for each part, for its `/info` and the docs' figures. */
export interface SharedTowerSizes {
  readonly towerWeightBytes: number
  readonly projectorWeightBytes: Readonly<Record<string, number>>
}

interface SplitModel {
  readonly id: string
  readonly folder: string
  readonly tower: Uint8Array
  readonly projector: Uint8Array
  readonly cut: string
  readonly towerDigest: string
  readonly towerWeightBytes: number
  readonly projectorWeightBytes: number
}

const visionEncoderOf = (model: ModelDirectory, id: string): string => {
  const path = model.onnx.get("vision_encoder")
  if (path === undefined) throw new Error(`model ${id} has no onnx/vision_encoder.onnx to share a tower with`)
  return path
}

const splitModel = async ({ id, dir }: SharedTowerModel): Promise<SplitModel> => {
  const path = visionEncoderOf(await loadModelDirectory(dir), id)
  const read = await graphWithWeightsInPlace(path)
  const split = splitAtProjector(read.bytes, initializerBytes(dirname(path)))
  if (split.tower === undefined)
    throw new Error(`model ${id}'s vision encoder cannot be split at its projector: ${split.reason}`)
  return { id, folder: dirname(path), ...split }
}

/**
 * The models' processors must read an image alike, as the tower is fed once for all of them: the
 * same preprocessor_config.json and soft tokens an image. Throws what differs.
 */
export const checkSharedProcessing = async (base: SharedTowerModel, adapters: ReadonlyArray<SharedTowerModel>) => {
  const baseModel = await loadModelDirectory(base.dir)
  const reads = (model: ModelDirectory) =>
    JSON.stringify({
      preprocessor: model.preprocessorConfig ?? null,
      type: model.config.model_type ?? null,
      tokens: (model.config as { readonly mm_tokens_per_image?: unknown }).mm_tokens_per_image ?? null
    })
  if (baseModel.config.model_type !== "gemma3") {
    throw new Error(
      `model ${base.id} is a ${String(baseModel.config.model_type)}: only Gemma 3 models share a vision tower`
    )
  }
  for (const adapter of adapters) {
    const model = await loadModelDirectory(adapter.dir)
    if (reads(model) !== reads(baseModel)) {
      throw new Error(
        `model ${adapter.id} reads images otherwise than ${base.id} (its model type, preprocessor_config.json or mm_tokens_per_image differ): they cannot share a vision tower`
      )
    }
  }
}

export class SharedTower {
  private constructor(
    private readonly tower: ort.InferenceSession,
    private readonly cut: string,
    private readonly projectors: ReadonlyMap<string, ort.InferenceSession>,
    readonly sizes: SharedTowerSizes
  ) {}

  static async open(
    base: SharedTowerModel,
    adapters: ReadonlyArray<SharedTowerModel>,
    device: string,
    threads: number
  ): Promise<SharedTower> {
    const splits: Array<SplitModel> = []
    for (const model of [base, ...adapters]) splits.push(await splitModel(model))
    const [own, ...others] = splits as [SplitModel, ...Array<SplitModel>]
    for (const other of others) {
      if (other.towerDigest !== own.towerDigest || other.cut !== own.cut) {
        throw new Error(
          `model ${other.id}'s vision tower differs from ${own.id}'s (its graph or weights): one encoder cannot serve both; deploy it apart`
        )
      }
    }
    const tower = await createSession(own.tower, device, threads, { externalDataFolder: own.folder })
    const projectors = new Map<string, ort.InferenceSession>()
    for (const split of splits) {
      projectors.set(
        split.id,
        await createSession(split.projector, device, threads, { externalDataFolder: split.folder })
      )
    }
    return new SharedTower(tower, own.cut, projectors, {
      towerWeightBytes: own.towerWeightBytes,
      projectorWeightBytes: Object.fromEntries(splits.map((split) => [split.id, split.projectorWeightBytes]))
    })
  }

  /**
   * A batch's features: the tower once over all its images, whichever model each is for, then
   * each model's projector over its items' states. `items` gives each item's model and its images
   * (rows of the batch's first axis); each item gets its model's output over those images.
   */
  async embed(
    inputs: Record<string, ort.Tensor>,
    items: ReadonlyArray<{ readonly model: string; readonly rows: readonly [number, number] }>
  ): Promise<ReadonlyArray<ort.Tensor>> {
    for (const item of items) {
      if (!this.projectors.has(item.model)) {
        throw new Error(`this encoder embeds for ${[...this.projectors.keys()].join(", ")}, not ${item.model}`)
      }
    }
    const states = (await this.tower.run(inputs))[this.cut]!
    try {
      const [, ...inner] = states.dims
      const perImage = inner.reduce((product, size) => product * size, 1)
      const data = states.data as Float32Array
      const results = new Array<ort.Tensor>(items.length)
      const models = [...new Set(items.map((item) => item.model))]
      for (const model of models) {
        const mine = items.flatMap((item, index) => (item.model === model ? [{ item, index }] : []))
        const images = mine.reduce((sum, { item }) => sum + item.rows[1] - item.rows[0], 0)
        const gathered = new (data.constructor as Float32ArrayConstructor)(images * perImage)
        let at = 0
        for (const { item } of mine) {
          gathered.set(data.subarray(item.rows[0] * perImage, item.rows[1] * perImage), at)
          at += (item.rows[1] - item.rows[0]) * perImage
        }
        const projector = this.projectors.get(model)!
        const input = new ort.Tensor(states.type, gathered, [images, ...inner])
        const output = (await projector.run({ [this.cut]: input }))[projector.outputNames[0]!]!
        const [, ...outInner] = output.dims
        const perOutput = outInner.reduce((product, size) => product * size, 1)
        const outData = output.data as Float32Array
        let from = 0
        for (const { item, index } of mine) {
          const count = item.rows[1] - item.rows[0]
          results[index] = new ort.Tensor(output.type, outData.slice(from * perOutput, (from + count) * perOutput), [
            count,
            ...outInner
          ])
          from += count
        }
      }
      return results
    } finally {
      states.dispose()
    }
  }

  /** One model's encoder output for a batch of its images. */
  async run(model: string, inputs: Record<string, ort.Tensor>): Promise<ort.Tensor> {
    const images = Object.values(inputs)[0]!.dims[0]!
    return (await this.embed(inputs, [{ model, rows: [0, images] }]))[0]!
  }

  get inputNames(): ReadonlyArray<string> {
    return this.tower.inputNames
  }

  async release(): Promise<void> {
    await this.tower.release()
    for (const projector of this.projectors.values()) await projector.release()
  }
}
