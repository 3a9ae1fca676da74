/**
 * Decoders whose packed weights are kept on disk. As ONNX Runtime loads a model on the CPU it packs
 * every MatMul's weights into fresh memory (for fp32 and fp16 exports, all of the weights), and on a
 * 1B model that is most of a load: the kernel zeroes gigabytes of new pages before the packing
 * writes them. With a packed-weights folder (`serve --packed-weights-dir`), the first load of a
 * decoder also has ONNX Runtime write its optimized model with the packed weights beside the
 * originals (`session.save_external_prepacked_constant_initializers`); later loads open that copy,
 * whose packed weights ONNX Runtime maps from the file instead of packing them. The models bench's
 * prepack part measures both (bench/models.ts).
 *
 * A copy is only good for the graph, weights, ONNX Runtime and processor it was made with (the
 * optimized model may hold instructions for this CPU): its name is a hash of all of them, and a copy
 * of the same decoder made from other files replaces the older one. A copy being written is in a
 * `.partial-<pid>` folder, renamed into place once whole; one whose writer died is removed.
 */
import { createHash } from "node:crypto"
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs"
import { mkdir, rename, rm } from "node:fs/promises"
import { basename, join } from "node:path"
import { isRunning } from "../../process/Pids.js"

/** The folder executors keep decoders' packed weights in: `serve --packed-weights-dir` sets it for the executors it starts. */
export const packedWeightsDirEnvName = "CORNSERVE_PACKED_WEIGHTS_DIR"

/** Where a decoder's packed weights came from: mapped from a kept copy, packed and saved now, or packed only. */
export type PackedWeightsUse = "mapped" | "saved" | "packed"

const modelFile = "decoder.onnx"
const dataFile = `${modelFile}_data`
const partialMarker = ".partial-"

/** The processor, as /proc/cpuinfo names it and its instruction sets (the first processor's). */
const processorIdentity = (): string => {
  try {
    const text = readFileSync("/proc/cpuinfo", "utf8")
    const first = text.split("\n\n")[0] ?? ""
    return first
      .split("\n")
      .filter((line) => /^(vendor_id|model name|flags)\s*:/.test(line))
      .join("\n")
  } catch {
    return "unknown processor"
  }
}

/**
 * The name of a decoder's kept copy: `<decoder>-<hash>`, the hash over the graph given to ONNX
 * Runtime, the files its weights are read from (name, size, time), ONNX Runtime's version and the
 * processor.
 */
export const packedWeightsName = (
  decoder: string,
  graph: Uint8Array,
  weightsFolder: string,
  runtimeVersion: string
): string => {
  const hash = createHash("sha256")
  hash.update(`cornserve packed weights 1\n${runtimeVersion}\n${processorIdentity()}\n`)
  hash.update(graph)
  for (const name of readdirSync(weightsFolder).sort()) {
    const stat = statSync(join(weightsFolder, name))
    if (stat.isFile()) hash.update(`\n${name} ${stat.size} ${stat.mtimeMs}`)
  }
  return `${decoder.replaceAll(/[^A-Za-z0-9_.-]/g, "_")}-${hash.digest("hex").slice(0, 32)}`
}

/** The kept copy's model file, if it is whole. */
export const keptCopy = (dir: string, name: string): string | undefined => {
  const path = join(dir, name, modelFile)
  return existsSync(path) && existsSync(join(dir, name, dataFile)) ? path : undefined
}

/** Where a new copy is written while ONNX Runtime makes it, and the session options that have it written there. */
export const newCopy = async (dir: string, name: string) => {
  await mkdir(dir, { recursive: true })
  removeAbandonedCopies(dir)
  const partial = join(dir, `${name}${partialMarker}${process.pid}`)
  await rm(partial, { recursive: true, force: true })
  await mkdir(partial)
  return {
    optimizedModelFilePath: join(partial, modelFile),
    sessionConfig: {
      save_external_prepacked_constant_initializers: "1",
      optimized_model_external_initializers_file_name: dataFile,
      optimized_model_external_initializers_min_size_in_bytes: "1024"
    },
    /** The copy is whole: it takes its place, replacing copies of the same decoder made from other files. */
    keep: async () => {
      const final = join(dir, name)
      if (existsSync(final)) return rm(partial, { recursive: true, force: true })
      await rename(partial, final)
      const decoder = name.slice(0, name.lastIndexOf("-") + 1)
      for (const other of readdirSync(dir))
        if (other !== name && other.startsWith(decoder) && !other.includes(partialMarker))
          await rm(join(dir, other), { recursive: true, force: true })
    },
    discard: () => rm(partial, { recursive: true, force: true })
  }
}

/** A kept copy that cannot be opened is removed, so that the next load writes it again. */
export const removeCopy = (dir: string, name: string) => rm(join(dir, name), { recursive: true, force: true })

/** Copies whose writer died while writing them. */
const removeAbandonedCopies = (dir: string) => {
  for (const name of readdirSync(dir)) {
    const at = name.lastIndexOf(partialMarker)
    if (at < 0) continue
    const pid = Number(name.slice(at + partialMarker.length))
    if (Number.isSafeInteger(pid) && pid > 0 && pid !== process.pid && !isRunning(pid))
      void rm(join(dir, name), { recursive: true, force: true }).catch(() => undefined)
  }
}

/** A short form of a kept copy's path for logs. */
export const copyLabel = (dir: string, name: string) => join(basename(dir), name)
