"""``tensorboard.program.TensorBoard``'s two calls the tensorboard role makes (configure, launch), over
``http.server``: a real server of the log dir on a free port, its URL returned as TensorBoard's launch does."""
import functools
import http.server
import threading


class TensorBoard:
    def configure(self, argv):
        args = dict(zip(argv[1::2], argv[2::2]))
        self.logdir, self.host = args["--logdir"], args["--host"]

    def launch(self):
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=self.logdir)
        server = http.server.ThreadingHTTPServer((self.host, 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://{self.host}:{server.server_address[1]}/"
