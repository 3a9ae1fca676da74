/** A built-in model: a deterministic function from nothing to the files of a model directory. */

/** File contents by path relative to the model directory ("config.json", "onnx/embed_tokens.onnx"). */
export type ModelFiles = ReadonlyMap<string, Uint8Array>

export interface ModelRecipe {
  readonly name: string
  /** Bumped whenever the files change, so that a cached build from an older recipe is rebuilt. */
  readonly version: number
  readonly build: () => ModelFiles
}

/** Stamped into every built config.json as `cornserve`, to find stale builds in the cache. */
export const recipeStamp = (recipe: Pick<ModelRecipe, "name" | "version">) => ({
  recipe: recipe.name,
  version: recipe.version
})

export const jsonFile = (value: unknown): Uint8Array => new TextEncoder().encode(`${JSON.stringify(value, null, 2)}\n`)
