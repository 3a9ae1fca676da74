import { mkdir, open, writeFile } from "node:fs/promises"
import { dirname, join } from "node:path"

/** A built-in model: a deterministic function from nothing to the files of a model directory. */

/** File contents by path relative to the model directory ("config.json", "onnx/embed_tokens.onnx"). */
export type ModelFiles = ReadonlyMap<string, Uint8Array>

/**
 * A file's contents: its bytes, or the pieces it is written from one after another (an external
 * data file of gigabytes, which no single buffer holds).
 */
export type FileContent = Uint8Array | ReadonlyArray<Uint8Array>

/**
 * What a recipe builds, file by file, in the order they are written. A large model yields its
 * files lazily (one graph at a time), so that a build holds one graph's weights, not the model's.
 */
export type ModelBuild = Iterable<readonly [string, FileContent]>

export interface ModelRecipe {
  readonly name: string
  /** Bumped whenever the files change, so that a cached build from an older recipe is rebuilt. */
  readonly version: number
  readonly build: () => ModelBuild
}

/** Writes a build's files below `dir`, each as it is produced. */
export const writeModelBuild = async (dir: string, build: ModelBuild): Promise<void> => {
  for (const [file, content] of build) {
    const path = join(dir, file)
    await mkdir(dirname(path), { recursive: true })
    if (content instanceof Uint8Array) {
      await writeFile(path, content)
      continue
    }
    const handle = await open(path, "w")
    try {
      for (const piece of content) await handle.write(piece)
    } finally {
      await handle.close()
    }
  }
}

/** Stamped into every built config.json as `cornserve`, to find stale builds in the cache. */
export const recipeStamp = (recipe: Pick<ModelRecipe, "name" | "version">) => ({
  recipe: recipe.name,
  version: recipe.version
})

export const jsonFile = (value: unknown): Uint8Array => new TextEncoder().encode(`${JSON.stringify(value, null, 2)}\n`)
