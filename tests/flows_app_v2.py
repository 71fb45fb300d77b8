"""flows_app.py's `versioned` flow after a change of its code, made with `ctx.patched` so that
runs begun before the change replay as they were recorded (test_e2e_flow_patches.py)."""
from actors.sdk import App
from flows_app import new_step, old_step


async def versioned(ctx, args):
    if await ctx.patched("new-first-step"):
        first = await ctx.step(new_step, args["file"])
    else:
        first = await ctx.step(old_step, args["file"])
    message = await ctx.wait("go")
    return {"first": first, "message": message}


app = App(flows=[versioned])
