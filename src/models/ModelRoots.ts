import { delimiter, isAbsolute, relative, resolve, sep } from "node:path"

/**
 * Which directories a task may name a model by path in. An app names its tasks' models, and an app
 * is not trusted with the host's file system: a path anywhere would let it point an executor at
 * any directory and learn from the answer whether that directory exists. A model path is taken
 * only below a root the platform knows (its model cache, the Hugging Face cache) or the operator
 * allows, and the check is on the path as written (`.` and `..` resolved), before the file system
 * is asked anything, so that a refusal says nothing of what is there.
 */

/** The operator's model roots in the environment, separated as in PATH (":" on Linux). */
export const modelRootsEnvName = "CORNSERVE_MODEL_ROOTS"

/** The model roots CORNSERVE_MODEL_ROOTS names (none when it is unset). */
export const modelRootsFromEnvironment = (): ReadonlyArray<string> =>
  (process.env[modelRootsEnvName] ?? "")
    .split(delimiter)
    .map((root) => root.trim())
    .filter((root) => root.length > 0)

/** Whether `path` (absolute) is `root` or below it, by the path alone. */
const isWithin = (path: string, root: string): boolean => {
  const below = relative(resolve(root), path)
  return below === "" || (!isAbsolute(below) && below !== ".." && !below.startsWith(`..${sep}`))
}

/** Whether the model path `id` (relative paths from the working directory) lies below one of `roots`. */
export const isUnderModelRoots = (id: string, roots: ReadonlyArray<string>): boolean => {
  const path = resolve(id)
  return roots.some((root) => isWithin(path, root))
}
