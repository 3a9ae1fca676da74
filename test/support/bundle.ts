import * as esbuild from "esbuild"

/**
 * Bundles a TypeScript script into `outfile`, its dependencies left external, so that a child
 * process can run it with plain node (benchmarks' baselines, tests' stand-in executors).
 */
export const bundleScript = async (entry: string, outfile: string): Promise<string> => {
  await esbuild.build({
    entryPoints: [entry],
    outfile,
    bundle: true,
    packages: "external",
    platform: "node",
    format: "esm",
    target: "node20",
    logLevel: "warning"
  })
  return outfile
}
