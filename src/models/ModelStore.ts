import { mkdir, mkdtemp, readFile, rename, rm, stat, writeFile } from "node:fs/promises"
import { homedir } from "node:os"
import { basename, dirname, join, resolve } from "node:path"
import type { Dtype } from "./Dtype.js"
import { type ModelDownloadEvent, parseHubId, resolveHubModel } from "./Hub.js"
import { UnknownModel } from "./ModelErrors.js"
import { benchDecoder125m } from "./recipes/BenchDecoder125m.js"
import { benchVitB16 } from "./recipes/BenchVitB16.js"
import { benchSmolLm2 } from "./recipes/RandomLlama.js"
import type { ModelRecipe } from "./recipes/Recipe.js"
import { tinyColorPainter } from "./recipes/TinyColorPainter.js"
import { tinyColorTones } from "./recipes/TinyColorTones.js"
import { tinyColorVlm } from "./recipes/TinyColorVlm.js"

/**
 * The model cache: built-in recipes are built into it on first use (or by `cornserve models
 * build`), hub models are downloaded into it, and a model id is a recipe name, the path of a local
 * model directory, or a hub id (`org/name`).
 */

export { UnknownModel } from "./ModelErrors.js"

const builtinRecipes = [tinyColorVlm, tinyColorPainter, tinyColorTones]
/** Random-weight presets at realistic sizes; hundreds of MB each, so built only when named. */
const benchRecipes = [benchVitB16, benchDecoder125m, benchSmolLm2]
const recipes = new Map<string, ModelRecipe>(
  [...builtinRecipes, ...benchRecipes].map((recipe) => [recipe.name, recipe])
)

export const builtinModelNames: ReadonlyArray<string> = builtinRecipes.map((recipe) => recipe.name)
export const benchModelNames: ReadonlyArray<string> = benchRecipes.map((recipe) => recipe.name)

export const modelCacheDir = (): string =>
  process.env.CORNSERVE_MODEL_DIR ?? join(homedir(), ".cache", "cornserve", "models")

const recipeNamed = (name: string): ModelRecipe => {
  const recipe = recipes.get(name)
  if (recipe === undefined) {
    throw new UnknownModel({ id: name, reason: `no such recipe; known: ${[...recipes.keys()].join(", ")}` })
  }
  return recipe
}

const errorCode = (error: unknown) => (error as NodeJS.ErrnoException).code

/** Whether `dir` holds a build of the recipe's current version. */
const isCurrentBuild = async (dir: string, recipe: ModelRecipe): Promise<boolean> => {
  try {
    const config = JSON.parse(await readFile(join(dir, "config.json"), "utf8")) as {
      cornserve?: { recipe?: string; version?: number }
    }
    return config.cornserve?.recipe === recipe.name && config.cornserve.version === recipe.version
  } catch {
    return false
  }
}

/**
 * Builds into a fresh folder next to `target`, then renames it into place, so a reader sees either
 * no model or a whole one. Renaming onto a non-empty directory fails, which is how two processes
 * building at once find out: with `keepCurrentBuild`, the loser keeps the winner's (identical) build.
 */
const install = async (recipe: ModelRecipe, target: string, keepCurrentBuild: boolean): Promise<void> => {
  const parent = dirname(target)
  await mkdir(parent, { recursive: true })
  const staging = await mkdtemp(join(parent, `.${basename(target)}.building-`))
  try {
    for (const [file, bytes] of recipe.build()) {
      await mkdir(dirname(join(staging, file)), { recursive: true })
      await writeFile(join(staging, file), bytes)
    }
    for (;;) {
      try {
        await rename(staging, target)
        return
      } catch (error) {
        if (errorCode(error) !== "ENOTEMPTY" && errorCode(error) !== "EEXIST") throw error
      }
      if (keepCurrentBuild && (await isCurrentBuild(target, recipe))) return
      const retired = `${staging}.replaced`
      try {
        await rename(target, retired)
      } catch (error) {
        if (errorCode(error) !== "ENOENT") throw error
      }
      await rm(retired, { recursive: true, force: true })
    }
  } finally {
    await rm(staging, { recursive: true, force: true })
  }
}

/** Builds recipe `name` into `<dir>/<name>` (replacing what is there) and returns that directory. */
export const buildModel = async (name: string, dir: string = modelCacheDir()): Promise<string> => {
  const recipe = recipeNamed(name)
  const target = resolve(dir, name)
  await install(recipe, target, false)
  return target
}

export interface ResolveOptions {
  /** For hub models: the ONNX precision to use (by default fp32, or the least lossy one there). */
  readonly dtype?: Dtype | undefined
  /** For hub models: never download (also HF_HUB_OFFLINE=1). */
  readonly offline?: boolean | undefined
  /** For hub models: ask the hub for newer files even when the model is here. */
  readonly refresh?: boolean | undefined
  /** For hub models: what a download is doing. */
  readonly onProgress?: ((event: ModelDownloadEvent) => void) | undefined
}

/**
 * The directory of model `id`: a recipe name resolves into the cache, built there on first use
 * (or when the cached build is from an older recipe); an existing directory is used as it is; a
 * hub id (`org/name`, `org/name@revision`) is looked up on this machine and downloaded when absent.
 */
export const resolveModel = async (id: string, options: ResolveOptions = {}): Promise<string> => {
  const recipe = recipes.get(id)
  if (recipe !== undefined) {
    const target = resolve(modelCacheDir(), id)
    if (!(await isCurrentBuild(target, recipe))) await install(recipe, target, true)
    return target
  }
  const path = resolve(id)
  const info = await stat(path).catch(() => undefined)
  const hubRef = parseHubId(id)
  if (hubRef !== undefined && (info === undefined || !info.isDirectory())) {
    return resolveHubModel(id, hubRef, modelCacheDir(), {
      dtype: options.dtype,
      offline: options.offline,
      refresh: options.refresh,
      onEvent: options.onProgress
    })
  }
  if (info === undefined || !info.isDirectory()) {
    throw new UnknownModel({
      id,
      reason:
        `not a built-in model (${builtinModelNames.join(", ")}), not a hub id (org/name) ` +
        `and no directory exists at ${path}`
    })
  }
  const hasConfig = await stat(join(path, "config.json")).then(
    (config) => config.isFile(),
    () => false
  )
  if (!hasConfig) throw new UnknownModel({ id, reason: `the directory ${path} holds no config.json` })
  return path
}
