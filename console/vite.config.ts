import { fileURLToPath } from "node:url"
import { defineConfig } from "vite"

/**
 * The web console, built into the package at `npm run build` (dist/console/, served by the gateway
 * at /console). Preact's JSX through esbuild: no plugin. No source maps and no inline scripts or
 * styles, so that the page runs under the gateway's strict Content-Security-Policy.
 */
export default defineConfig({
  root: fileURLToPath(new URL(".", import.meta.url)),
  base: "/console/",
  publicDir: "public",
  logLevel: "warn",
  esbuild: { jsx: "automatic", jsxImportSource: "preact" },
  build: {
    outDir: fileURLToPath(new URL("../dist/console/", import.meta.url)),
    emptyOutDir: true,
    assetsDir: "assets",
    assetsInlineLimit: 0,
    sourcemap: false,
    target: "es2022",
    reportCompressedSize: false
  }
})
