import { defineConfig } from "vite";

// `npm run dev` proxies the API to a service started with `make run` (port 8000).
export default defineConfig({
  base: "/",
  build: { outDir: "dist", emptyOutDir: true, sourcemap: false, chunkSizeWarningLimit: 400 },
  server: { proxy: { "/api": "http://127.0.0.1:8000" } },
});
