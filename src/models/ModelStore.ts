import { mkdir, mkdtemp, readFile, rename, rm, stat } from "node:fs/promises"
import { homedir } from "node:os"
import { basename, dirname, join, resolve } from "node:path"
import type { Dtype } from "./Dtype.js"
import { shortened } from "../app-runtime/Shortened.js"
import { huggingFaceCacheDir, type ModelDownloadEvent, parseHubId, resolveHubModel } from "./Hub.js"
import { UnknownModel } from "./ModelErrors.js"
import { isUnderModelRoots, modelRootsFromEnvironment } from "./ModelRoots.js"
import { benchDecoder125m } from "./recipes/BenchDecoder125m.js"
import { benchVitB16 } from "./recipes/BenchVitB16.js"
import { benchMiniLmL6, tinyTextEmbedder } from "./recipes/RandomBert.js"
import { benchQwen2VL2b } from "./recipes/BenchQwen2VL2b.js"
import { benchLlama1b, benchSmolLm2 } from "./recipes/RandomLlama.js"
import { type ModelRecipe, writeModelBuild } from "./recipes/Recipe.js"
import { tinyColorPainter } from "./recipes/TinyColorPainter.js"
import { tinyColorTones } from "./recipes/TinyColorTones.js"
import { tinyColorVlm } from "./recipes/TinyColorVlm.js"
import { tinyJanus } from "./recipes/RandomJanus.js"
import { tinyMimi } from "./recipes/RandomMimi.js"
import { tinySpeechT5 } from "./recipes/RandomSpeechT5.js"
import { tinyWhisper } from "./recipes/RandomWhisper.js"
import { tinyTalker } from "./recipes/TinyTalker.js"

/**
 * The model cache: built-in recipes are built into it on first use (or by `cornserve models
 * build`), hub models are downloaded into it, and a model id is a recipe name, the path of a local
 * model directory, or a hub id (`org/name`).
 */

export { UnknownModel } from "./ModelErrors.js"

const builtinRecipes = [
  tinyColorVlm,
  tinyColorPainter,
  tinyColorTones,
  tinyTextEmbedder,
  tinyWhisper,
  tinySpeechT5,
  tinyJanus,
  tinyMimi,
  tinyTalker
]
/** Random-weight presets at realistic sizes; hundreds of MB each, so built only when named. */
const benchRecipes = [benchVitB16, benchDecoder125m, benchSmolLm2, benchLlama1b, benchQwen2VL2b, benchMiniLmL6]
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
    await writeModelBuild(staging, recipe.build())
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
  /**
   * Directories the operator allows model paths in, besides the model cache and the Hugging Face
   * cache (default: those CORNSERVE_MODEL_ROOTS names). A model path anywhere else is refused.
   */
  readonly modelRoots?: ReadonlyArray<string> | undefined
}

/** Every directory a model path may be in: the model cache, the Hugging Face cache and the operator's roots. */
export const allowedModelRoots = (operatorRoots: ReadonlyArray<string> = modelRootsFromEnvironment()) => [
  modelCacheDir(),
  huggingFaceCacheDir(),
  ...operatorRoots
]

/**
 * The refusal of a model id that is no recipe, no hub id and no path below an allowed root. It is
 * the same whatever is at that path, so that it tells nothing of the host's directories.
 */
const unknownModel = (id: string) =>
  new UnknownModel({
    id: shortened(id),
    reason:
      `not a built-in model (${builtinModelNames.join(", ")}), not a hub id (org/name), and not a model ` +
      "directory this node allows: a model given by path must be below CORNSERVE_MODEL_DIR, the Hugging Face " +
      "cache or a model root the operator allows (serve --model-root, CORNSERVE_MODEL_ROOTS)"
  })

/**
 * The refusal of model `id` when it names a path this node does not allow (see `allowedModelRoots`),
 * decided by the id alone, before any file is looked at: for a registration to refuse an app at
 * once. `undefined` for a recipe name, a hub id and an allowed path.
 */
export const disallowedModelPath = (id: string, modelRoots?: ReadonlyArray<string>): UnknownModel | undefined =>
  unknownBuiltin(id) ??
  (recipes.has(id) || parseHubId(id) !== undefined || isUnderModelRoots(id, allowedModelRoots(modelRoots))
    ? undefined
    : unknownModel(id))

/**
 * `cornserve/...` names only built-in models: a name there that is none (a misspelling) is refused
 * with the closest one, rather than looked up on the hub.
 */
export const unknownBuiltin = (id: string): UnknownModel | undefined => {
  if (!id.startsWith("cornserve/") || recipes.has(id)) return undefined
  const known = [...builtinModelNames, ...benchModelNames]
  const closest = known
    .map((name) => ({ name, distance: editDistance(id, name) }))
    .sort((a, b) => a.distance - b.distance)[0]
  const hint = closest !== undefined && closest.distance <= 3 ? `did you mean ${closest.name}? ` : ""
  return new UnknownModel({
    id: shortened(id),
    reason: `no built-in model has this name; ${hint}the built-in models are ${known.join(", ")}`
  })
}

/** Levenshtein distance, for names of a few dozen characters. */
const editDistance = (a: string, b: string): number => {
  let previous = Array.from({ length: b.length + 1 }, (_, index) => index)
  for (let i = 1; i <= a.length; i++) {
    const current = [i]
    for (let j = 1; j <= b.length; j++) {
      current[j] = Math.min(previous[j]! + 1, current[j - 1]! + 1, previous[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1))
    }
    previous = current
  }
  return previous[b.length]!
}

/**
 * The directory of model `id`: a recipe name resolves into the cache, built there on first use
 * (or when the cached build is from an older recipe); a directory below an allowed root (see
 * `allowedModelRoots`) is used as it is; a hub id (`org/name`, `org/name@revision`) is looked up on
 * this machine and downloaded when absent. Any other id is refused before the file system is asked
 * about it.
 */
export const resolveModel = async (id: string, options: ResolveOptions = {}): Promise<string> => {
  const misspelt = unknownBuiltin(id)
  if (misspelt !== undefined) throw misspelt
  const recipe = recipes.get(id)
  if (recipe !== undefined) {
    const target = resolve(modelCacheDir(), id)
    if (!(await isCurrentBuild(target, recipe))) await install(recipe, target, true)
    return target
  }
  const allowed = isUnderModelRoots(id, allowedModelRoots(options.modelRoots))
  const path = resolve(id)
  const info = allowed ? await stat(path).catch(() => undefined) : undefined
  const hubRef = parseHubId(id)
  if (hubRef !== undefined && (info === undefined || !info.isDirectory())) {
    return resolveHubModel(id, hubRef, modelCacheDir(), {
      dtype: options.dtype,
      offline: options.offline,
      refresh: options.refresh,
      onEvent: options.onProgress
    })
  }
  if (!allowed) throw unknownModel(id)
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
